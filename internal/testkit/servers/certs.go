package servers

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// Certs is a certificate authority made for one test and the certificates
// it issued, as PEM files in one directory: a server certificate whose
// subject alternative names are 127.0.0.1 and localhost, and a client
// certificate. Keys are ECDSA P-256, which PostgreSQL (OpenSSL), RabbitMQ
// (Erlang's ssl) and Go all accept.
type Certs struct {
	// Dir holds the files.
	Dir string
	// CAFile is the CA's certificate: what a client trusts.
	CAFile string
	// ServerCertFile and ServerKeyFile are the server's certificate and
	// key, valid for 127.0.0.1 and localhost.
	ServerCertFile, ServerKeyFile string
	// ClientCertFile and ClientKeyFile are a client certificate and its key;
	// the certificate's common name is the ClientName given to NewCerts
	// (PostgreSQL's cert authentication maps it to the user of that name).
	ClientCertFile, ClientKeyFile string
	// CAName is the CA's common name.
	CAName string
}

// NewCerts makes a CA named caName and issues a server certificate for
// 127.0.0.1 and localhost and a client certificate for clientName, written
// to dir (created when missing; t.TempDir() will do: only the clients read
// these files, the servers get copies of their own).
func NewCerts(dir, caName, clientName string) (*Certs, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("servers: %w", err)
	}
	c := &Certs{
		Dir: dir, CAName: caName,
		CAFile:         filepath.Join(dir, "ca.pem"),
		ServerCertFile: filepath.Join(dir, "server.pem"), ServerKeyFile: filepath.Join(dir, "server.key"),
		ClientCertFile: filepath.Join(dir, "client.pem"), ClientKeyFile: filepath.Join(dir, "client.key"),
	}
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("servers: generate CA key: %w", err)
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: caName, Organization: []string{"sagabox tests"}},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, fmt.Errorf("servers: create CA certificate: %w", err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, fmt.Errorf("servers: %w", err)
	}
	if err := writePEM(c.CAFile, "CERTIFICATE", caDER, 0o644); err != nil {
		return nil, err
	}
	issue := func(cn string, usage x509.ExtKeyUsage, certFile, keyFile string) error {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return fmt.Errorf("servers: generate key for %s: %w", cn, err)
		}
		tmpl := &x509.Certificate{
			SerialNumber: serial(),
			Subject:      pkix.Name{CommonName: cn, Organization: []string{"sagabox tests"}},
			NotBefore:    now.Add(-time.Hour),
			NotAfter:     now.Add(24 * time.Hour),
			KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
			ExtKeyUsage:  []x509.ExtKeyUsage{usage},
		}
		if usage == x509.ExtKeyUsageServerAuth {
			tmpl.DNSNames = []string{"localhost"}
			tmpl.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1)}
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			return fmt.Errorf("servers: issue certificate for %s: %w", cn, err)
		}
		keyDER, err := x509.MarshalECPrivateKey(key)
		if err != nil {
			return fmt.Errorf("servers: %w", err)
		}
		if err := writePEM(certFile, "CERTIFICATE", der, 0o644); err != nil {
			return err
		}
		return writePEM(keyFile, "EC PRIVATE KEY", keyDER, 0o600)
	}
	if err := issue("localhost", x509.ExtKeyUsageServerAuth, c.ServerCertFile, c.ServerKeyFile); err != nil {
		return nil, err
	}
	if err := issue(clientName, x509.ExtKeyUsageClientAuth, c.ClientCertFile, c.ClientKeyFile); err != nil {
		return nil, err
	}
	return c, nil
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		return big.NewInt(time.Now().UnixNano())
	}
	return n
}

func writePEM(file, kind string, der []byte, mode os.FileMode) error {
	b := pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der})
	if err := os.WriteFile(file, b, mode); err != nil {
		return fmt.Errorf("servers: write %s: %w", file, err)
	}
	return nil
}

// copyFile copies src to dst with mode.
func copyFile(src, dst string, mode os.FileMode) error {
	b, err := os.ReadFile(src)
	if err != nil {
		return fmt.Errorf("servers: %w", err)
	}
	if err := os.WriteFile(dst, b, mode); err != nil {
		return fmt.Errorf("servers: %w", err)
	}
	return nil
}
