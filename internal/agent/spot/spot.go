package spot

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/feature/ec2/imds"
	smithyhttp "github.com/aws/smithy-go/transport/http"
	"github.com/go-logr/logr"
	"google.golang.org/protobuf/types/known/timestamppb"
	"k8s.io/apimachinery/pkg/util/wait"

	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// InstanceActionPath is the metadata path of the spot interruption notice.
const InstanceActionPath = "spot/instance-action"

// LifeCyclePath is the metadata path of the instance's purchasing
// option: "spot" or "on-demand" (also "scheduled").
const LifeCyclePath = "instance-life-cycle"

// detectAttempts bounds how often Detect is tried before the watcher gives
// up (no instance metadata: not on EC2), and detectTimeout each try.
const (
	detectAttempts = 3
	detectTimeout  = 5 * time.Second
)

// DefaultInterval is how often the notice is polled (AWS suggests every
// five seconds; the notice comes two minutes ahead).
const DefaultInterval = 5 * time.Second

// MetadataAPI is the part of the IMDS client used here.
type MetadataAPI interface {
	GetMetadata(ctx context.Context, in *imds.GetMetadataInput, optFns ...func(*imds.Options)) (*imds.GetMetadataOutput, error)
}

// NewClient returns an IMDS client; endpoint overrides the metadata
// address (empty: the SDK's default, 169.254.169.254). It speaks IMDSv2
// only: when no session token can be had it fails rather than falling back
// to tokenless IMDSv1 reads (instances are launched with HttpTokens
// required and a hop limit of 1, so nothing on the node but its host
// network namespace gets a token).
func NewClient(endpoint string) *imds.Client {
	return imds.New(imds.Options{Endpoint: endpoint, EnableFallback: imdsV1Fallback})
}

// imdsV1Fallback is off: tokenless reads are never made.
const imdsV1Fallback = aws.FalseTernary

// IMDS is EC2's instance metadata service as a Source, read through
// Client (NewClient: IMDSv2 only).
type IMDS struct {
	Client MetadataAPI
}

var _ Source = IMDS{}

// Watcher polls the notice until it appears, then keeps it.
type Watcher struct {
	// Source is the cloud's metadata service: IMDS on EC2, GCP on Google
	// Cloud.
	Source   Source
	Interval time.Duration
	Log      logr.Logger
	// Notified, when set, is called once when the notice appears (the
	// session sends a report at once).
	Notified func()
	// Detect makes Run read instance-life-cycle first and poll only when
	// it says spot (NSTANCE_SPOT_NOTICE=auto); when the metadata cannot
	// be read after a few tries (not on EC2), Run returns.
	Detect bool

	mu     sync.Mutex
	notice *nstancev1.TerminationNotice
	polls  int
}

// instanceAction is the JSON of spot/instance-action.
type instanceAction struct {
	Action string    `json:"action"`
	Time   time.Time `json:"time"`
}

// Notice returns the interruption notice, nil while none is known.
func (w *Watcher) Notice() *nstancev1.TerminationNotice {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.notice
}

// Polls counts completed polls.
func (w *Watcher) Polls() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.polls
}

// Run polls until ctx ends or the notice appears (it does not go away:
// the instance is being reclaimed). The first poll is immediate.
func (w *Watcher) Run(ctx context.Context) {
	iv := w.Interval
	if iv <= 0 {
		iv = DefaultInterval
	}
	if w.Detect && !w.detect(ctx, iv) {
		return
	}
	failing := false
	// The condition never returns an error, so the poll ends only with the
	// notice or with ctx: there is nothing to report.
	_ = wait.PollUntilContextCancel(ctx, iv, true, func(ctx context.Context) (bool, error) {
		n, err := w.Poll(ctx)
		if ctx.Err() != nil {
			return true, nil
		}
		switch {
		case err != nil:
			// Logged once per outage, not every poll.
			if !failing {
				w.Log.Error(err, "reading the spot interruption notice from instance metadata; retrying")
			}
			failing = true
		case n != nil:
			w.Log.Info("spot interruption notice", "action", n.GetMessage(), "deadline", n.GetDeadline().AsTime())
			if w.Notified != nil {
				w.Notified()
			}
			return true, nil
		default:
			if failing {
				w.Log.Info("instance metadata readable again")
			}
			failing = false
		}
		return false, nil
	})
}

// detect reads instance-life-cycle (up to detectAttempts tries, iv
// apart) and reports whether the instance is spot.
func (w *Watcher) detect(ctx context.Context, iv time.Duration) bool {
	var err error
	for i := range detectAttempts {
		if i > 0 {
			select {
			case <-ctx.Done():
				return false
			case <-time.After(iv):
			}
		}
		var lc string
		dctx, cancel := context.WithTimeout(ctx, detectTimeout)
		lc, err = w.Source.LifeCycle(dctx)
		cancel()
		if err == nil {
			if lc != "spot" {
				w.Log.V(1).Info("not a spot instance: not watching for interruption notices", "instance_life_cycle", lc)
				return false
			}
			w.Log.Info("spot instance: watching for interruption notices")
			return true
		}
		if ctx.Err() != nil {
			return false
		}
	}
	w.Log.Info("no instance metadata: not watching for spot interruption notices", "error", err.Error())
	return false
}

// LifeCycle implements Source: the instance's purchasing option from
// instance-life-cycle ("spot", "on-demand", ...).
func (m IMDS) LifeCycle(ctx context.Context) (string, error) {
	out, err := m.Client.GetMetadata(ctx, &imds.GetMetadataInput{Path: LifeCyclePath})
	if err != nil {
		return "", fmt.Errorf("spot: GET %s: %w", LifeCyclePath, err)
	}
	defer func() { _ = out.Content.Close() }()
	b, err := io.ReadAll(io.LimitReader(out.Content, 1<<10))
	if err != nil {
		return "", fmt.Errorf("spot: reading %s: %w", LifeCyclePath, err)
	}
	return strings.TrimSpace(string(b)), nil
}

// Notice implements Source: spot/instance-action, which answers 404 until
// EC2 schedules the interruption.
func (m IMDS) Notice(ctx context.Context) (*nstancev1.TerminationNotice, error) {
	out, err := m.Client.GetMetadata(ctx, &imds.GetMetadataInput{Path: InstanceActionPath})
	if err != nil {
		var re *smithyhttp.ResponseError
		if errors.As(err, &re) && re.HTTPStatusCode() == http.StatusNotFound {
			return nil, nil
		}
		return nil, fmt.Errorf("spot: GET %s: %w", InstanceActionPath, err)
	}
	defer func() { _ = out.Content.Close() }()
	b, err := io.ReadAll(io.LimitReader(out.Content, 64<<10))
	if err != nil {
		return nil, fmt.Errorf("spot: reading %s: %w", InstanceActionPath, err)
	}
	return parse(b)
}

// Poll reads the notice once from the Source: nil, nil while there is
// none. A notice read is kept.
func (w *Watcher) Poll(ctx context.Context) (*nstancev1.TerminationNotice, error) {
	if n := w.Notice(); n != nil {
		return n, nil
	}
	n, err := w.Source.Notice(ctx)
	w.mu.Lock()
	defer w.mu.Unlock()
	w.polls++
	if err != nil || n == nil {
		return nil, err
	}
	w.notice = n
	return n, nil
}

func parse(b []byte) (*nstancev1.TerminationNotice, error) {
	var ia instanceAction
	if err := json.Unmarshal(b, &ia); err != nil {
		return nil, fmt.Errorf("spot: %s is not the instance-action JSON: %w", InstanceActionPath, err)
	}
	switch ia.Action {
	case "terminate", "stop", "hibernate":
	default:
		return nil, fmt.Errorf("spot: %s: unknown action %q", InstanceActionPath, ia.Action)
	}
	n := &nstancev1.TerminationNotice{Kind: nstancev1.TerminationKind_TERMINATION_KIND_SPOT, Message: "spot interruption: " + ia.Action}
	if !ia.Time.IsZero() {
		n.Deadline = timestamppb.New(ia.Time)
	}
	return n, nil
}
