package redistest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// TestPKI is a throwaway certificate authority and a server certificate it
// signed for 127.0.0.1, ::1 and localhost, as PEM files.
type TestPKI struct {
	CAFile   string // the CA's certificate: what a client trusts
	CertFile string // the server's certificate
	KeyFile  string // the server's private key
}

// NewTestPKI makes a TestPKI in a temporary directory of t's, valid from an
// hour ago for a day. Each call makes a new CA, which trusts no other's
// server.
func NewTestPKI(t testing.TB) *TestPKI {
	t.Helper()
	p, err := writePKI(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// writePKI writes a new CA and a server certificate it signed into dir.
func writePKI(dir string) (*TestPKI, error) {
	now := time.Now()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	ca := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "redistest CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	if ca, err = x509.ParseCertificate(caDER); err != nil {
		return nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	leaf := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: "localhost"},
		DNSNames:     []string{"localhost"},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	leafDER, err := x509.CreateCertificate(rand.Reader, leaf, ca, &key.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, err
	}
	p := &TestPKI{CAFile: filepath.Join(dir, "ca.pem"), CertFile: filepath.Join(dir, "server.pem"), KeyFile: filepath.Join(dir, "server.key")}
	for _, f := range []struct {
		path, typ string
		der       []byte
	}{{p.CAFile, "CERTIFICATE", caDER}, {p.CertFile, "CERTIFICATE", leafDER}, {p.KeyFile, "PRIVATE KEY", keyDER}} {
		if err := os.WriteFile(f.path, pem.EncodeToMemory(&pem.Block{Type: f.typ, Bytes: f.der}), 0o600); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// TLSServer is a dedicated redis-server that also takes TLS connections,
// started with StartTLSServer. Its plaintext port (Server.Addr) stays open
// for the harness (readiness, SHUTDOWN) and for a test's own checks.
type TLSServer struct {
	*Server
	TLSAddr string // 127.0.0.1:port of the TLS port
	PKI     *TestPKI
}

// StartTLSServer starts a redis-server as StartServer does, which also
// listens for TLS on TLSAddr, a second free loopback port, with a
// certificate for 127.0.0.1, ::1 and localhost signed by a CA made for this
// server (PKI.CAFile); clients need no certificate of their own
// (--tls-auth-clients no). args are appended to the server's arguments. It
// skips the test where redis-server is missing (outside CI) and fails it
// where redis-server was built without TLS.
func StartTLSServer(t testing.TB, args ...string) *TLSServer {
	t.Helper()
	if state.skipMsg != "" {
		t.Skip(state.skipMsg)
	}
	if _, err := lookRedis(); err != nil {
		t.Skip(err.Error())
	}
	pki := NewTestPKI(t)
	dir := t.TempDir() // registered before the server's cleanup: removed after it
	var lastErr error
	for range maxPortTries {
		tlsPort, err := pickPort(false)
		if err != nil {
			lastErr = err
			continue
		}
		all := append([]string{"--tls-port", strconv.Itoa(tlsPort), "--tls-cert-file", pki.CertFile, "--tls-key-file", pki.KeyFile,
			"--tls-ca-cert-file", pki.CAFile, "--tls-auth-clients", "no"}, args...)
		p, err := startOnFreePort(dir, all, false)
		if err != nil {
			// The TLS port taken meanwhile shows as the same error as the
			// main port: try another pair.
			if lastErr = err; errors.Is(err, errPortInUse) {
				continue
			}
			t.Fatal(err)
		}
		s := &Server{port: p.port, dir: dir, args: all, p: p}
		t.Cleanup(func() { s.stop() })
		ts := &TLSServer{Server: s, TLSAddr: addrFor(tlsPort), PKI: pki}
		if err := ts.ping(); err != nil {
			t.Fatalf("redistest: the TLS port %s of the server on %s does not answer: %v; log:\n%s", ts.TLSAddr, s.Addr(), err, p.logTail())
		}
		return ts
	}
	t.Fatal(fmt.Errorf("redistest: no usable ports for a TLS server after %d tries: %w", maxPortTries, lastErr))
	return nil
}

// TLSClient returns a client to the TLS port that trusts the server's CA,
// closed when the test ends.
func (s *TLSServer) TLSClient(t testing.TB) *redis.Client {
	t.Helper()
	cfg, err := s.tlsConfig()
	if err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(&redis.Options{Addr: s.TLSAddr, TLSConfig: cfg})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// tlsConfig trusts the server's CA only.
func (s *TLSServer) tlsConfig() (*tls.Config, error) {
	pem, err := os.ReadFile(s.PKI.CAFile)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, errors.New("redistest: no certificate in " + s.PKI.CAFile)
	}
	return &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}, nil
}

// ping answers PING over TLS, verifying the server's certificate.
func (s *TLSServer) ping() error {
	cfg, err := s.tlsConfig()
	if err != nil {
		return err
	}
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: readyTimeout}, "tcp", s.TLSAddr, cfg)
	if err != nil {
		return err
	}
	defer conn.Close()
	if err := conn.SetDeadline(time.Now().Add(readyTimeout)); err != nil {
		return err
	}
	if _, err := conn.Write([]byte("*1\r\n$4\r\nPING\r\n")); err != nil {
		return err
	}
	b := make([]byte, 7)
	if n, err := conn.Read(b); err != nil || string(b[:n]) != "+PONG\r\n" {
		return fmt.Errorf("PING: %q, %v", b[:n], err)
	}
	return nil
}
