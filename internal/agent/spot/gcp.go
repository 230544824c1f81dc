package spot

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// Source is a cloud's metadata service as the watcher reads it (IMDS,
// GCP).
type Source interface {
	// LifeCycle returns "spot" for a spot (preemptible) instance.
	LifeCycle(ctx context.Context) (string, error)
	// Notice returns the preemption notice, nil while there is none.
	Notice(ctx context.Context) (*nstancev1.TerminationNotice, error)
}

// Google Cloud metadata server paths (below /computeMetadata/v1/).
const (
	GCPPreemptedPath = "instance/preempted"
	GCPModelPath     = "instance/scheduling/provisioning-model"
	GCPLegacyPath    = "instance/scheduling/preemptible"
)

// DefaultGCPEndpoint is the metadata server's address.
const DefaultGCPEndpoint = "http://169.254.169.254"

// GCPNoticeLead is how long Compute Engine gives a preempted VM before it
// stops it (30s): the notice's deadline.
const GCPNoticeLead = 30 * time.Second

// GCP reads the Google Cloud metadata server: instance/preempted turns
// TRUE when Compute Engine preempts a spot (or preemptible) VM.
type GCP struct {
	// Endpoint is the metadata server (empty: DefaultGCPEndpoint).
	Endpoint string
	// HTTP is the client (nil: one with a 5s timeout).
	HTTP *http.Client
	// Now stamps the deadline (nil: time.Now).
	Now func() time.Time
}

var _ Source = (*GCP)(nil)

// errGCPNotFound is a 404 of the metadata server.
type errGCPNotFound struct{ path string }

func (e errGCPNotFound) Error() string { return "spot: GET " + e.path + ": 404 not found" }

func (g *GCP) get(ctx context.Context, path string) (string, error) {
	ep := g.Endpoint
	if ep == "" {
		ep = DefaultGCPEndpoint
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(ep, "/")+"/computeMetadata/v1/"+path, nil)
	if err != nil {
		return "", fmt.Errorf("spot: GET %s: %w", path, err)
	}
	req.Header.Set("Metadata-Flavor", "Google")
	c := g.HTTP
	if c == nil {
		c = &http.Client{Timeout: detectTimeout}
	}
	resp, err := c.Do(req)
	if err != nil {
		return "", fmt.Errorf("spot: GET %s: %w", path, err)
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<10))
	switch {
	case resp.StatusCode == http.StatusNotFound:
		return "", errGCPNotFound{path}
	case resp.StatusCode != http.StatusOK:
		return "", fmt.Errorf("spot: GET %s: %s", path, resp.Status)
	case resp.Header.Get("Metadata-Flavor") != "Google":
		return "", fmt.Errorf("spot: GET %s: the answer is not the Google metadata server's", path)
	case err != nil:
		return "", fmt.Errorf("spot: reading %s: %w", path, err)
	}
	return strings.TrimSpace(string(b)), nil
}

// LifeCycle implements Source: "spot" when the provisioning model is SPOT
// (or, on VMs that lack it, the legacy preemptible flag is TRUE).
func (g *GCP) LifeCycle(ctx context.Context) (string, error) {
	m, err := g.get(ctx, GCPModelPath)
	if _, ok := err.(errGCPNotFound); ok {
		p, perr := g.get(ctx, GCPLegacyPath)
		if perr != nil {
			return "", perr
		}
		if strings.EqualFold(p, "TRUE") {
			return "spot", nil
		}
		return "on-demand", nil
	}
	if err != nil {
		return "", err
	}
	if strings.EqualFold(m, "SPOT") {
		return "spot", nil
	}
	return "on-demand", nil
}

// Notice implements Source.
func (g *GCP) Notice(ctx context.Context) (*nstancev1.TerminationNotice, error) {
	v, err := g.get(ctx, GCPPreemptedPath)
	if err != nil {
		return nil, err
	}
	switch strings.ToUpper(v) {
	case "FALSE":
		return nil, nil
	case "TRUE":
	default:
		return nil, fmt.Errorf("spot: %s: want TRUE or FALSE, got %q", GCPPreemptedPath, v)
	}
	now := time.Now
	if g.Now != nil {
		now = g.Now
	}
	return &nstancev1.TerminationNotice{Kind: nstancev1.TerminationKind_TERMINATION_KIND_SPOT,
		Message: "spot preemption (gcp)", Deadline: timestamppb.New(now().Add(GCPNoticeLead))}, nil
}
