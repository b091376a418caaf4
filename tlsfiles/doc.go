// Package tlsfiles owns allocd's TLS credentials read from PEM files: the server's
// certificate and key, the CA that client certificates are verified against, and a
// client's CA bundle and certificate. The files are read again every Refresh (by
// grpc-go's pemfile certificate providers), so a rotated certificate or CA is served
// to new connections without a restart; connections open at the rotation keep the
// certificates they were made with. A file that cannot be read or parsed during a
// rotation leaves the previous certificates in use.
//
// allocd's daemon builds its gRPC and metrics listeners on a Server; a shim's client
// (client.WithDialOptions(c.DialOption())), `allocd health` and replicas that forward
// calls to each other dial with a Client. A Client keeps why its last connection could
// not start TLS (HandshakeError, crypto/tls's own error), which gRPC's error of the
// call keeps only as text:
//
//	srv, err := tlsfiles.NewServer(tlsfiles.Files{CertFile: "tls.crt", KeyFile: "tls.key",
//		CAFile: "clients-ca.crt"})
//	if err != nil { ... }
//	defer srv.Close()
//	gs := grpc.NewServer(grpc.Creds(srv.Credentials()))
//
//	cli, err := tlsfiles.NewClient(tlsfiles.Files{CAFile: "ca.crt", CertFile: "shim.crt",
//		KeyFile: "shim.key"})
//	if err != nil { ... }
//	defer cli.Close()
//	ac, err := client.New("allocd.example:8080", client.WithDialOptions(cli.DialOption()))
package tlsfiles
