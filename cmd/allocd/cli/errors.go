package cli

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"reflect"
	"strings"
	"time"
	"unicode"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/allocd/allocd/client"
	"github.com/allocd/allocd/tlsfiles"
)

// callError is a call to allocd that failed, as a command reports it.
type callError struct {
	what    string // what the command did: "describe allocation 10.0.0.10"
	server  string
	timeout time.Duration
	tls     bool // the call was made over TLS
	// handshake is why the connection could not start TLS, if it could not.
	handshake error
	json      bool // print the status as JSON
	write     bool // the call changes state: an unknown outcome is said
	// notOwnerHint replaces release's hint (--force) after ErrNotOwner, when set.
	notOwnerHint string
	err          error
}

func (e *callError) Error() string { return e.what + ": " + e.err.Error() }
func (e *callError) Unwrap() error { return e.err }

// print writes the error: one line, or its status as JSON.
func (e *callError) print(w io.Writer) {
	if e.json {
		st, ok := status.FromError(e.err)
		if !ok {
			st = status.New(codes.Unknown, e.err.Error())
		}
		if ce := (*client.Error)(nil); errors.As(e.err, &ce) && unreached(ce) {
			// Not allocd's answer: say which address was tried.
			st = status.New(st.Code(), "cannot reach allocd at "+e.server+": "+st.Message())
		}
		b, err := protojson.Marshal(st.Proto())
		if err == nil {
			if err = writeIndented(w, b); err == nil {
				return
			}
		}
	}
	fmt.Fprintln(w, "error: "+e.line())
}

// line says in words what failed, why, and what to do about it: the gRPC code, the
// message, and what the google.rpc details add (the bad fields, who holds an address,
// which range is full).
func (e *callError) line() string {
	var ce *client.Error
	if !errors.As(e.err, &ce) {
		if st, ok := status.FromError(e.err); ok {
			return fmt.Sprintf("%s: %s: %s", e.what, codeWords(st.Code()), oneLine(st.Message()))
		}
		return e.what + ": " + oneLine(e.err.Error())
	}
	if unreached(ce) {
		ask := tlsHint(e.handshake)
		switch {
		case ask != "":
		case e.tls:
			ask = "is --server right, and is allocd running?"
		default:
			ask = "is --server right, is allocd running, does it serve TLS (--tls-ca-file)?"
		}
		if ce.Code == codes.DeadlineExceeded {
			return fmt.Sprintf("%s: no answer from allocd at %s within %s: not connected (%s); %s",
				e.what, e.server, e.timeout, oneLine(ce.Message), ask)
		}
		return fmt.Sprintf("%s: cannot reach allocd at %s: %s; %s", e.what, e.server, oneLine(ce.Message),
			ask)
	}
	s := fmt.Sprintf("%s: %s: %s", e.what, codeWords(ce.Code), oneLine(ce.Message))
	if ce.Code == codes.DeadlineExceeded {
		s = fmt.Sprintf("%s: allocd at %s did not answer within %s (--timeout)", e.what, e.server, e.timeout)
	}
	hints := hints(ce, e.notOwnerHint)
	if e.write && client.OutcomeUnknown(ce) {
		hints = append(hints, "it may or may not have been applied: look, or run the same command again")
	}
	if len(hints) > 0 {
		s += " (" + strings.Join(hints, "; ") + ")"
	}
	return s
}

// tlsHint says what to change when a connection could not start TLS, from err, the
// handshake's error (tlsfiles.Client.HandshakeError); "" when there is nothing to say.
func tlsHint(err error) string {
	var (
		header   tls.RecordHeaderError
		verify   *tls.CertificateVerificationError
		unknown  x509.UnknownAuthorityError
		hostname x509.HostnameError
		invalid  x509.CertificateInvalidError
		remote   *net.OpError
	)
	switch {
	case err == nil:
	case errors.As(err, &header):
		return "allocd at --server serves plaintext: drop --tls and the --tls-* flags"
	case errors.As(err, &verify), errors.As(err, &unknown), errors.As(err, &hostname),
		errors.As(err, &invalid):
		return "allocd's certificate is not trusted, or does not name --server: give the CA that signed it " +
			"with --tls-ca-file"
	case errors.As(err, &remote) && remote.Op == "remote error" && refusals[alertOf(remote.Err)]:
		return "allocd refused the client certificate: check --tls-cert-file and --tls-private-key-file " +
			"against allocd's --client-ca-file, and the certificate's dates"
	case errors.Is(err, tlsfiles.ErrClosedAfterHandshake):
		return "allocd closed the connection as TLS started, as it does when it refuses the client " +
			"certificate: check --tls-cert-file and --tls-private-key-file against allocd's --client-ca-file"
	}
	return ""
}

// refusals are the TLS alerts (RFC 8446) of a server that refuses the client's
// certificate: bad_certificate, certificate_expired, unknown_ca, certificate_required.
var refusals = map[uint64]bool{42: true, 45: true, 48: true, 116: true}

// alertOf returns the code of a TLS alert that crypto/tls received from the peer: it
// reports one as a *net.OpError with Op "remote error" whose Err is its alert type, an
// unexported uint8. 0 (close_notify) for any other error.
func alertOf(err error) uint64 {
	if v := reflect.ValueOf(err); v.Kind() == reflect.Uint8 {
		return v.Uint()
	}
	return 0
}

// unreached reports whether a call failed without reaching allocd: no connection.
// allocd itself also says that a call was not applied (outcome=not_applied in its
// ErrorInfo), with a reason; such a call did reach it.
func unreached(e *client.Error) bool {
	return e.NotApplied && e.Reason == "" && (e.Code == codes.Unavailable || e.Code == codes.DeadlineExceeded)
}

// hints says what the details of e add to its message, and what to do; notOwner is
// what to do after ErrNotOwner ("" : release's --force).
func hints(e *client.Error, notOwner string) []string {
	var out []string
	var inv *client.InvalidError
	if errors.As(e, &inv) && len(inv.Violations) > 0 {
		fields := make([]string, len(inv.Violations))
		for i, v := range inv.Violations {
			fields[i] = v.Field
		}
		out = append(out, "bad field: "+strings.Join(fields, ", "))
	}
	var held *client.AlreadyAllocatedError
	if errors.As(e, &held) && held.Resource != "" {
		out = append(out, fmt.Sprintf("holder: %s; allocd describe allocation %s tells more", holder(e, held),
			held.Resource))
	}
	var full *client.FullError
	if errors.As(e, &full) {
		for _, v := range full.Violations {
			out = append(out, fullHint(v.Subject))
		}
	}
	switch {
	case errors.Is(e, client.ErrNotOwner) && notOwner != "":
		out = append(out, notOwner)
	case errors.Is(e, client.ErrNotOwner):
		out = append(out, "--force releases it whoever holds it")
	case errors.Is(e, client.ErrUnauthenticated):
		out = append(out, "present a client certificate: --tls-cert-file and --tls-private-key-file")
	case e.Code == codes.Unavailable && e.RetryDelay > 0:
		out = append(out, fmt.Sprintf("allocd suggests trying again in %s", e.RetryDelay))
	}
	return out
}

// holder names the holder of an address as "namespace/name (uid UID)".
func holder(e *client.Error, held *client.AlreadyAllocatedError) string {
	ns, name := e.Metadata["holder_namespace"], e.Metadata["holder_name"]
	if name == "" || held.HolderUID == "" {
		return held.Holder
	}
	return fmt.Sprintf("%s/%s (uid %s)", ns, name, held.HolderUID)
}

// fullHint says what to do about a full range, or several ("10.0.0.0/24, 10.1.0.0/29":
// every ready ServiceCIDR of a family).
func fullHint(subject string) string {
	if subject == "" {
		return "make room: release what is unused (allocd get ranges shows what is full)"
	}
	var lists []string
	cidr := false
	for _, r := range strings.Split(subject, ", ") {
		if _, err := netip.ParsePrefix(r); err == nil {
			cidr = true
		}
		lists = append(lists, "allocd get allocations --range "+r)
	}
	if cidr {
		return fmt.Sprintf("full: %s; make room: release what is unused (%s) or add a range (allocd create "+
			"servicecidr NAME CIDR)",
			subject, strings.Join(lists, "; "))
	}
	return fmt.Sprintf("full: %s; make room: release unused node ports (%s)", subject,
		strings.Join(lists, "; "))
}

// codeWords spells a gRPC code in words: AlreadyExists is "already exists".
func codeWords(c codes.Code) string {
	var b strings.Builder
	for i, r := range c.String() {
		if unicode.IsUpper(r) {
			if i > 0 {
				b.WriteByte(' ')
			}
			r = unicode.ToLower(r)
		}
		b.WriteRune(r)
	}
	return b.String()
}
