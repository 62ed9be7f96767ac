package grpcidem

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"slices"
	"strings"

	"github.com/onceonly/idempotency"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
)

// callerRule is how calls are told apart when WithCallerIdentity is not
// given; the interceptor refuses to start without one.
type callerRule int

const (
	callerUnset callerRule = iota
	callerCredentials
	callerShared
)

const errNoCallerRule = "grpcidem: UnaryServerInterceptor needs to know who the callers are, or one caller's " +
	"stored answer could reach another: pass WithCallerCredentials (authorization, proxy-authorization, " +
	"cookie, the peer's TLS certificate and the metadata you name), WithCallerIdentity " +
	"(IdentityByMetadata, IdentityByPeerCertificate or your own function) or WithSharedKeys"

// standardCredentials are the metadata WithCallerCredentials always binds.
var standardCredentials = []string{"authorization", "proxy-authorization"}

// IdentityByMetadata names the caller by the values of the metadata name
// (an API key, the user an authenticating proxy names), for
// WithCallerIdentity: a digest of them, so that no credential reaches
// Redis or a log. A call without it is refused UNAUTHENTICATED. A caller
// whose value changes between two tries is another caller, and its retry
// runs again; WithCallerCredentials refuses such a retry instead.
func IdentityByMetadata(name string) func(context.Context) (string, error) {
	name = strings.ToLower(name)
	return func(ctx context.Context) (string, error) {
		md, _ := metadata.FromIncomingContext(ctx)
		values := md.Get(name)
		if len(values) == 0 {
			return "", idempotency.ErrNoScope
		}
		return digest("metadata "+name+" ", appendValues(nil, values)), nil
	}
}

// IdentityByPeerCertificate names the caller by the certificate its TLS
// peer presented (mutual TLS), for WithCallerIdentity. A call without one
// is refused UNAUTHENTICATED.
func IdentityByPeerCertificate() func(context.Context) (string, error) {
	return func(ctx context.Context) (string, error) {
		cert := peerCertificate(ctx)
		if cert == nil {
			return "", idempotency.ErrNoScope
		}
		return digest("tls ", cert), nil
	}
}

// peerCertificate is the leaf certificate of the call's TLS peer, or nil.
func peerCertificate(ctx context.Context) []byte {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return nil
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(info.State.PeerCertificates) == 0 {
		return nil
	}
	return info.State.PeerCertificates[0].Raw
}

func digest(label string, material []byte) string {
	sum := sha256.Sum256(material)
	return label + hex.EncodeToString(sum[:])
}

func appendValues(b []byte, values []string) []byte {
	b = binary.BigEndian.AppendUint32(b, uint32(len(values)))
	for _, v := range values {
		b = binary.BigEndian.AppendUint32(b, uint32(len(v)))
		b = append(b, v...)
	}
	return b
}

// callerDigest digests the call's credentials under WithCallerCredentials:
// every value of each credential metadata (the standard ones, then the
// declared ones), in order; every cookie of the cookie metadata, sorted,
// so that neither their order nor their split over several values counts;
// the peer's TLS certificate. ok is false for a call that has none.
func (c *config) callerDigest(ctx context.Context, md metadata.MD) (sum [sha256.Size]byte, ok bool) {
	var cookies []string
	for _, line := range md.Get("cookie") {
		for c := range strings.SplitSeq(line, ";") {
			if c = strings.TrimSpace(c); c != "" {
				cookies = append(cookies, c)
			}
		}
	}
	slices.Sort(cookies)
	cert := peerCertificate(ctx)
	present := len(cookies) > 0 || cert != nil
	var b []byte
	for _, names := range [2][]string{standardCredentials, c.credentials} {
		for _, name := range names {
			values := md.Get(name)
			present = present || len(values) > 0
			b = appendValues(b, values)
		}
	}
	if !present {
		return sum, false
	}
	b = appendValues(b, cookies)
	b = appendValues(b, []string{string(cert)})
	return sha256.Sum256(b), true
}
