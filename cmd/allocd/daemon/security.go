package daemon

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/authz"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/allocd/allocd/server"
	"github.com/allocd/allocd/tlsfiles"
)

// clientCAPolicy is the authorization policy of --client-ca-file without
// --authorization-policy-file: any caller with a verified client certificate (that
// names something: a URI or DNS SAN, or a subject) may call everything; reflection is
// open to everyone; grpc.health.v1 is never authorized (see healthMethods).
const clientCAPolicy = `{
  "name": "allocd-client-ca",
  "allow_rules": [
    {"name": "reflection", "request": {"paths": [
      "/grpc.reflection.v1.ServerReflection/*", "/grpc.reflection.v1alpha.ServerReflection/*"]}},
    {"name": "client-certificates", "source": {"principals": ["*"]}}
  ]
}`

// healthMethods are answered to every caller, authorized or not, with or without a
// client certificate: probes and load balancers must reach them whatever the policy.
const healthMethods = "/grpc.health.v1.Health/"

// validateSecurity checks the TLS and authorization flags and reads their files.
func (c *Config) validateSecurity() []error {
	var errs []error
	tlsPair := []string{"--tls-cert-file", "--tls-private-key-file"}
	if (c.TLSCertFile == "") != (c.TLSPrivateKeyFile == "") {
		errs = append(errs, flagError(ErrFlagsTogether, tlsPair,
			"--tls-cert-file and --tls-private-key-file go together"))
	} else if c.TLSCertFile != "" {
		if _, err := tlsfiles.CheckKeyPair(c.TLSCertFile, c.TLSPrivateKeyFile); err != nil {
			errs = append(errs, flagError(ErrFlagValue, tlsPair, "--tls-cert-file/--tls-private-key-file: %w",
				err))
		}
	}
	if c.ClientCAFile != "" {
		if c.TLSCertFile == "" {
			errs = append(errs, flagError(ErrFlagNeeds, append([]string{"--client-ca-file"}, tlsPair...),
				"--client-ca-file needs --tls-cert-file and --tls-private-key-file: client certificates are "+
					"verified in the TLS handshake"))
		} else if err := tlsfiles.CheckCA(c.ClientCAFile); err != nil {
			errs = append(errs, badValue("--client-ca-file", "--client-ca-file: %w", err))
		}
	}
	if c.AuthorizationPolicyFile != "" {
		if c.ClientCAFile == "" {
			errs = append(errs,
				flagError(ErrFlagNeeds, []string{"--authorization-policy-file", "--client-ca-file"},
					"--authorization-policy-file needs --client-ca-file: the policy's principals are client "+
						"certificate identities"))
		}
		if b, err := os.ReadFile(c.AuthorizationPolicyFile); err != nil {
			errs = append(errs,
				badValue("--authorization-policy-file", "--authorization-policy-file: %w", err))
		} else if _, err := authz.NewStatic(string(b)); err != nil {
			errs = append(errs, badValue("--authorization-policy-file", "--authorization-policy-file %s: %w",
				c.AuthorizationPolicyFile, err))
		}
	}
	if c.MetricsTLS && (c.TLSCertFile == "" || c.MetricsAddress == "") {
		errs = append(errs, flagError(ErrFlagNeeds,
			[]string{"--metrics-tls", "--tls-cert-file", "--tls-private-key-file", "--metrics-address"},
			"--metrics-tls needs --tls-cert-file, --tls-private-key-file and --metrics-address"))
	}
	return errs
}

// authorizer is what authz.StaticInterceptor and authz.FileWatcherInterceptor have.
type authorizer interface {
	UnaryInterceptor(ctx context.Context, req any, info *grpc.UnaryServerInfo,
		h grpc.UnaryHandler) (any, error)
	StreamInterceptor(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error
}

// security is what the TLS and authorization flags make of allocd: the listeners'
// certificates, the credentials replicas dial each other with, and the authorization
// of calls. Its zero value is plaintext without authorization.
type security struct {
	server  *tlsfiles.Server // nil without --tls-cert-file
	peer    *tlsfiles.Client // nil without --tls-cert-file
	authz   authorizer       // nil without --client-ca-file
	watcher *authz.FileWatcherInterceptor
	log     *slog.Logger
	// self is the identity of this replica's certificate (--tls-cert-file at start): the
	// one identity whose calls may carry forwarding metadata when calls are authorized.
	self string
	// stopPolicyCheck stops checkPolicyFile's goroutine and waits for it.
	stopPolicyCheck func()
}

// newSecurity starts reading the certificates and the policy of c; close stops it.
func newSecurity(c Config, log *slog.Logger) (*security, error) {
	s := &security{log: log}
	if c.TLSCertFile == "" {
		return s, nil
	}
	refresh := c.securityRefresh
	if refresh <= 0 {
		refresh = tlsfiles.DefaultRefresh
	}
	files := tlsfiles.Files{CertFile: c.TLSCertFile, KeyFile: c.TLSPrivateKeyFile, CAFile: c.ClientCAFile,
		Refresh: refresh}
	var err error
	if s.server, err = tlsfiles.NewServer(files); err != nil {
		return nil, fmt.Errorf("--tls-cert-file/--tls-private-key-file/--client-ca-file: %w", err)
	}
	// Replicas present their own certificate to each other and verify the other's
	// against the client CAs (the system roots without them).
	if s.peer, err = tlsfiles.NewClient(files); err != nil {
		s.close()
		return nil, fmt.Errorf("--tls-cert-file/--tls-private-key-file/--client-ca-file: %w", err)
	}
	if leaf, err := tlsfiles.CheckKeyPair(c.TLSCertFile, c.TLSPrivateKeyFile); err == nil && leaf != nil {
		s.self = tlsfiles.Identity(leaf)
	}
	switch {
	case c.AuthorizationPolicyFile != "":
		s.stopPolicyCheck = checkPolicyFile(c.AuthorizationPolicyFile, files.Refresh, log)
		s.watcher, err = authz.NewFileWatcherWithOptions(authz.FileWatcherOptions{
			PolicyFile:      c.AuthorizationPolicyFile,
			RefreshDuration: files.Refresh,
			OnPolicyUpdate: func(string) {
				log.Info("authorization policy loaded", "file", c.AuthorizationPolicyFile)
			},
		})
		s.authz = s.watcher
	case c.ClientCAFile != "":
		s.authz, err = authz.NewStatic(clientCAPolicy)
	}
	if err != nil {
		s.close()
		return nil, fmt.Errorf("--authorization-policy-file %s: %w", c.AuthorizationPolicyFile, err)
	}
	warnSecurity(c, log)
	return s, nil
}

// warnSecurity logs what the TLS flags leave open, and a replica certificate that
// other replicas would refuse when it forwards calls to them.
func warnSecurity(c Config, log *slog.Logger) {
	switch {
	case c.ClientCAFile == "":
		log.Warn("TLS without --client-ca-file: any caller that reaches the port may call everything, " +
			"forced releases included")
		return
	case c.AuthorizationPolicyFile == "":
		log.Warn("--client-ca-file without --authorization-policy-file: any caller with a verified client " +
			"certificate may call everything")
	}
	pair, err := tls.LoadX509KeyPair(c.TLSCertFile, c.TLSPrivateKeyFile)
	if err != nil || len(pair.Certificate) == 0 {
		return // validateSecurity reported it
	}
	cert, err := x509.ParseCertificate(pair.Certificate[0])
	caPEM, rerr := os.ReadFile(c.ClientCAFile)
	if err != nil || rerr != nil {
		return
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(caPEM)
	if _, err := cert.Verify(x509.VerifyOptions{Roots: roots,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		log.Warn("--tls-cert-file is not a client certificate that --client-ca-file verifies: the other "+
			"replicas will refuse the calls this one forwards to them (repair, feeds)",
			"err", err)
	}
}

// authorizing tells whether calls are authorized (then Release refuses force: see
// server.AllocatorService.RequireForceRelease).
func (s *security) authorizing() bool { return s.authz != nil }

// serverOptions are the gRPC server's credentials and authorization interceptors.
func (s *security) serverOptions() []grpc.ServerOption {
	var opts []grpc.ServerOption
	if s.server != nil {
		opts = append(opts, grpc.Creds(s.server.Credentials()))
	}
	if s.authz != nil {
		opts = append(opts, grpc.ChainUnaryInterceptor(s.authorizeUnary),
			grpc.ChainStreamInterceptor(s.authorizeStream),
			grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionAge: maxConnectionAge,
				MaxConnectionAgeGrace: maxConnectionAgeGrace}))
	}
	return opts
}

// peerCredentials are the credentials of calls forwarded to another replica (nil:
// plaintext).
func (s *security) peerCredentials() credentials.TransportCredentials {
	if s.peer == nil {
		return nil
	}
	return s.peer.Credentials()
}

func (s *security) close() {
	if s.stopPolicyCheck != nil {
		s.stopPolicyCheck()
	}
	if s.watcher != nil {
		s.watcher.Close()
	}
	if s.peer != nil {
		s.peer.Close()
	}
	if s.server != nil {
		s.server.Close()
	}
}

// authorizeUnary asks the policy before the handler runs. The policy's interceptor
// is run with a handler that does nothing, so that an error of the real handler is
// never taken for a refusal.
func (s *security) authorizeUnary(ctx context.Context, req any, info *grpc.UnaryServerInfo,
	h grpc.UnaryHandler) (any, error) {
	if strings.HasPrefix(info.FullMethod, healthMethods) {
		return h(ctx, req)
	}
	if err := expired(ctx, info.FullMethod); err != nil {
		return nil, err
	}
	allow := func(context.Context, any) (any, error) { return nil, nil }
	if _, err := s.authz.UnaryInterceptor(ctx, req, info, allow); err != nil {
		return nil, s.refused(ctx, info.FullMethod, err)
	}
	return h(s.trustForwarding(ctx, info.FullMethod), req)
}

func (s *security) authorizeStream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo,
	h grpc.StreamHandler) error {
	if strings.HasPrefix(info.FullMethod, healthMethods) {
		return h(srv, ss)
	}
	if err := expired(ss.Context(), info.FullMethod); err != nil {
		return err
	}
	allow := func(any, grpc.ServerStream) error { return nil }
	if err := s.authz.StreamInterceptor(srv, ss, info, allow); err != nil {
		return s.refused(ss.Context(), info.FullMethod, err)
	}
	if ctx := s.trustForwarding(ss.Context(), info.FullMethod); ctx != ss.Context() {
		ss = contextStream{ServerStream: ss, ctx: ctx}
	}
	return h(srv, ss)
}

// contextStream is a ServerStream with another context.
type contextStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (c contextStream) Context() context.Context { return c.ctx }

// trustForwarding honours the forwarding metadata of a call (server.ForwardingMetadata:
// which replica forwarded it, for whom, and a Service snapshot's receipt) only from a
// caller whose certificate identity is this replica's own (replicas share their
// certificate's identity, as the example policy's replica principal does): from anyone
// else it is dropped, so that no caller can pass for a replica (skip the leader's
// forwarding guard, or move the leak fence of a snapshot). A forwarded call is logged
// at debug with the original caller's identity.
func (s *security) trustForwarding(ctx context.Context, method string) context.Context {
	md, ok := metadata.FromIncomingContext(ctx)
	if !ok {
		return ctx
	}
	carries := false
	for _, k := range server.ForwardingMetadata {
		if len(md.Get(k)) > 0 {
			carries = true
		}
	}
	if !carries {
		return ctx
	}
	id := tlsfiles.PeerIdentity(ctx)
	if s.self != "" && id == s.self {
		replica, caller, _ := server.ForwardedFor(ctx)
		s.log.DebugContext(ctx, "forwarded call", "method", method, "replica", replica, "identity", caller)
		return ctx
	}
	md = md.Copy()
	for _, k := range server.ForwardingMetadata {
		md.Delete(k)
	}
	s.log.DebugContext(ctx, "forwarding metadata dropped: the caller is not a replica", "method", method,
		"identity", id)
	return metadata.NewIncomingContext(ctx, md)
}

// expired refuses a call whose client certificate expired after its connection was
// made: the handshake checked it then, and a connection lives on (for at most
// maxConnectionAge).
func expired(ctx context.Context, method string) error {
	if cert := tlsfiles.PeerCertificate(ctx); cert != nil && time.Now().After(cert.NotAfter) {
		return status.Errorf(codes.Unauthenticated,
			"%s: the client certificate of %q expired at %s: connect again with a valid one",
			method, tlsfiles.Identity(cert), cert.NotAfter.UTC().Format(time.RFC3339))
	}
	return nil
}

// maxConnectionAge bounds a connection's life when calls are authorized, so that a
// CA removed from --client-ca-file, or a tightened policy, also reaches the streams
// (watches) opened before: they are cut after maxConnectionAgeGrace more, and their
// clients connect again.
const (
	maxConnectionAge      = time.Hour
	maxConnectionAgeGrace = time.Minute
)

// refused turns the policy's refusal into UNAUTHENTICATED for a caller without a
// client certificate and PERMISSION_DENIED naming the identity for one with a
// certificate the policy does not admit.
func (s *security) refused(ctx context.Context, method string, err error) error {
	if status.Code(err) != codes.PermissionDenied {
		s.log.ErrorContext(ctx, "authorization failed", "method", method, "err", err)
		return status.Error(codes.Internal, "authorization failed")
	}
	cert := tlsfiles.PeerCertificate(ctx)
	if cert == nil {
		s.log.DebugContext(ctx, "call without a client certificate refused", "method", method)
		return status.Errorf(codes.Unauthenticated,
			"%s needs a client certificate signed by a CA of allocd's --client-ca-file (without one, only "+
				"grpc.health.v1.Health and what the policy opens to everyone answer)", method)
	}
	id := tlsfiles.Identity(cert)
	s.log.DebugContext(ctx, "call refused by the authorization policy", "method", method, "identity", id)
	return status.Errorf(codes.PermissionDenied, "%s: the authorization policy does not allow %q to call it",
		method, id)
}

// checkPolicyFile reads the policy file every refresh and logs, once per change, a
// file that cannot be read or is not a valid policy: grpc-go's file watcher keeps the
// last valid policy then and says so only through grpc-go's logger, which operators
// rarely see. It returns the function that stops it (and waits for it).
func checkPolicyFile(path string, refresh time.Duration, log *slog.Logger) func() {
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(refresh)
		defer tick.Stop()
		last := ""
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			why := policyFileProblem(path)
			if why != last && why != "" {
				log.Error("authorization policy file cannot be used; the last valid policy stays in force",
					"file", path, "error", why)
			}
			last = why
		}
	}()
	return func() { close(stop); <-done }
}

// policyFileProblem says what is wrong with the policy file, "" when nothing is.
func policyFileProblem(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	if _, err := authz.NewStatic(string(b)); err != nil {
		return err.Error()
	}
	return ""
}
