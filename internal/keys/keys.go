// Package keys builds Redis key components from user-supplied identifiers
// (business ids, rule keys) so that arbitrary bytes can never collide, break
// a Redis Cluster hash tag, or grow a key without bound.
//
// Foundation layer, imported by gcra, quotas, taskrl and the binaries' application code.
package keys

import (
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"strings"
)

// MaxEncoded is the longest string Encode returns.
const MaxEncoded = 64

// Encode maps an arbitrary identifier to a string of at most MaxEncoded bytes
// drawn from [A-Za-z0-9._~%-], which never contains '{', '}', ':' or
// whitespace and is therefore safe inside a key and inside a hash tag.
//
// The mapping is injective except for SHA-256 collisions:
//   - ids of 1..64 bytes from [A-Za-z0-9._-] are returned unchanged;
//   - other ids whose percent-encoding (%XX for every other byte) fits in 64
//     bytes are percent-encoded, so they contain '%' and differ from the first
//     form;
//   - everything else, including the empty id, becomes "~" followed by 32
//     base64url characters of its SHA-256, a form the other two never produce
//     because they escape '~'.
func Encode(id string) string {
	if id != "" && len(id) <= MaxEncoded && plain(id) {
		return id
	}
	if id != "" && len(id) <= MaxEncoded {
		var b strings.Builder
		for i := 0; i < len(id); i++ {
			c := id[i]
			if safe(c) {
				b.WriteByte(c)
				continue
			}
			if b.Len()+3 > MaxEncoded {
				return hashed(id)
			}
			fmt.Fprintf(&b, "%%%02X", c)
		}
		if b.Len() <= MaxEncoded {
			return b.String()
		}
	}
	return hashed(id)
}

func hashed(id string) string {
	sum := sha256.Sum256([]byte(id))
	return "~" + base64.RawURLEncoding.EncodeToString(sum[:24])
}

func plain(s string) bool {
	for i := 0; i < len(s); i++ {
		if !safe(s[i]) {
			return false
		}
	}
	return true
}

func safe(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-'
}

// ValidatePrefix reports whether p can be used as a key prefix: at most 64
// bytes, printable ASCII, without '{', '}' or spaces, so that it can never
// open a hash tag of its own.
func ValidatePrefix(p string) error {
	if len(p) > 64 {
		return fmt.Errorf("prefix %q is %d bytes; the maximum is 64", p[:16]+"…", len(p))
	}
	for i := 0; i < len(p); i++ {
		c := p[i]
		if c <= ' ' || c >= 0x7f || c == '{' || c == '}' {
			return fmt.Errorf("prefix %q contains %q; allowed are printable ASCII characters other than space, '{' and '}'", p, c)
		}
	}
	return nil
}

// Decode returns the identifier Encode mapped to enc, and false when enc is
// a hash (the identifier cannot be recovered) or not a form Encode returns.
func Decode(enc string) (string, bool) {
	if enc == "" || strings.HasPrefix(enc, "~") {
		return "", false
	}
	var b strings.Builder
	for i := 0; i < len(enc); i++ {
		c := enc[i]
		if c != '%' {
			if !safe(c) {
				return "", false
			}
			b.WriteByte(c)
			continue
		}
		if i+2 >= len(enc) {
			return "", false
		}
		var v byte
		if _, err := fmt.Sscanf(enc[i+1:i+3], "%02X", &v); err != nil {
			return "", false
		}
		b.WriteByte(v)
		i += 2
	}
	return b.String(), true
}
