package auth

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/util/wait"
	x509request "k8s.io/apiserver/pkg/authentication/request/x509"
	"k8s.io/apiserver/pkg/server/dynamiccertificates"
)

// clientCAPurpose names the CA provider in the library's logs and metrics,
// as kube-apiserver names its own.
const clientCAPurpose = "client-ca-bundle"

// clientCA is the CA bundle client certificates are verified against. The
// file is read with apiserver's dynamic CA provider, which reloads it when
// it changes (fsnotify, and a poll every minute) for as long as ctx lives.
// A file that does not exist yet is waited for, so a development stack can
// write it after the server started: until it appears, no certificate
// authenticates.
type clientCA struct {
	file     string
	provider atomic.Pointer[dynamiccertificates.DynamicFileCAContent]
}

// startClientCA loads file now if it exists, or else starts waiting for it.
// An existing file that is not a PEM CA bundle is an error.
func startClientCA(ctx context.Context, log logr.Logger, file string, poll time.Duration) (*clientCA, error) {
	c := &clientCA{file: file}
	if _, err := os.Stat(file); err == nil {
		if err := c.load(ctx); err != nil {
			return nil, err
		}
		return c, nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("client CA file: %w", err)
	}
	log.Info("client CA file does not exist yet; client certificates are not accepted until it does", "file", file)
	go func() {
		_ = wait.PollUntilContextCancel(ctx, poll, false, func(ctx context.Context) (bool, error) {
			if _, err := os.Stat(file); err != nil {
				return false, nil
			}
			if err := c.load(ctx); err != nil {
				// Half written, or not PEM yet: try again on the next tick.
				log.V(1).Info("client CA file not usable yet", "file", file, "reason", err.Error())
				return false, nil
			}
			log.Info("client CA file loaded", "file", file)
			return true, nil
		})
	}()
	return c, nil
}

// load reads the bundle and runs the provider's reloader until ctx ends.
func (c *clientCA) load(ctx context.Context) error {
	p, err := dynamiccertificates.NewDynamicCAContentFromFile(clientCAPurpose, c.file)
	if err != nil {
		return fmt.Errorf("client CA file %s: %w", c.file, err)
	}
	c.provider.Store(p)
	go p.Run(ctx, 1)
	return nil
}

// verifyOptions are the current roots; false until the file was loaded.
func (c *clientCA) verifyOptions() (x509.VerifyOptions, bool) {
	p := c.provider.Load()
	if p == nil {
		return x509.VerifyOptions{}, false
	}
	return p.VerifyOptions()
}

// authenticator maps a verified certificate to a user as kube-apiserver's
// --client-ca-file does: name from the CommonName, groups from the
// Organizations.
func (c *clientCA) authenticator() *x509request.Authenticator {
	return x509request.NewDynamic(c.verifyOptions, x509request.CommonNameUserConversion)
}
