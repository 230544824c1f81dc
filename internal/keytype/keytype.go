// Package keytype maps Go public keys to the wire API's KeyType, shared by
// the agent (which generates keys) and the server (which checks them).
package keytype

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rsa"

	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// Of reports the KeyType of a public key, or KEY_TYPE_UNSPECIFIED for a key
// the API has no name for.
func Of(pub crypto.PublicKey) nstancev1.KeyType {
	switch k := pub.(type) {
	case ed25519.PublicKey:
		return nstancev1.KeyType_KEY_TYPE_ED25519
	case *ecdsa.PublicKey:
		switch k.Curve {
		case elliptic.P256():
			return nstancev1.KeyType_KEY_TYPE_ECDSA_P256
		case elliptic.P384():
			return nstancev1.KeyType_KEY_TYPE_ECDSA_P384
		}
	case *rsa.PublicKey:
		switch k.N.BitLen() {
		case 2048:
			return nstancev1.KeyType_KEY_TYPE_RSA_2048
		case 4096:
			return nstancev1.KeyType_KEY_TYPE_RSA_4096
		}
	}
	return nstancev1.KeyType_KEY_TYPE_UNSPECIFIED
}
