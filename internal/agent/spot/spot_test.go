package spot

import (
	"context"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/feature/ec2/imds"
	"github.com/go-logr/logr/testr"
	"github.com/stretchr/testify/require"

	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

const notice = `{"action": "terminate", "time": "2026-11-24T08:22:00Z"}`

// The watcher polls through IMDSv2 (one token, reused) and sees nothing
// for the first polls; the notice it then reads is a spot termination
// with its deadline, and polling stops.
func TestWatcherReadsTheNoticeAfterPolls(t *testing.T) {
	f := newFakeIMDS(t, 4, notice)
	w := &Watcher{Source: IMDS{NewClient(f.URL)}, Interval: 10 * time.Millisecond, Log: testr.New(t)}
	notified := make(chan struct{})
	w.Notified = func() { close(notified) }
	require.Nil(t, w.Notice())
	done := make(chan struct{})
	go func() { defer close(done); w.Run(context.Background()) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("no notice")
	}
	<-notified
	n := w.Notice()
	require.NotNil(t, n)
	require.Equal(t, nstancev1.TerminationKind_TERMINATION_KIND_SPOT, n.GetKind())
	require.Equal(t, time.Date(2026, 11, 24, 8, 22, 0, 0, time.UTC), n.GetDeadline().AsTime())
	require.Contains(t, n.GetMessage(), "terminate")
	tokens, polls := f.counts()
	require.Equal(t, 5, polls, "four 404s, then the notice")
	require.Equal(t, 5, w.Polls())
	require.Equal(t, 1, tokens, "the session token is reused")
}

// Metadata errors are retried by the watcher; none is a notice.
func TestWatcherSurvivesMetadataErrors(t *testing.T) {
	f := newFakeIMDS(t, 3, `{"action": "stop", "time": "2026-11-24T08:22:00Z"}`)
	f.failFirst = 2
	c := imds.New(imds.Options{Endpoint: f.URL, Retryer: aws.NopRetryer{}})
	w := &Watcher{Source: IMDS{c}, Interval: 10 * time.Millisecond, Log: testr.New(t)}
	ctx := context.Background()
	for range 2 {
		n, err := w.Poll(ctx)
		require.Error(t, err)
		require.Nil(t, n)
	}
	n, err := w.Poll(ctx)
	require.NoError(t, err)
	require.Nil(t, n, "404: no notice")
	n, err = w.Poll(ctx)
	require.NoError(t, err)
	require.Contains(t, n.GetMessage(), "stop")
}

func TestWatcherRejectsGarbage(t *testing.T) {
	for _, body := range []string{`not json`, `{"action": "dance", "time": "2026-11-24T08:22:00Z"}`} {
		f := newFakeIMDS(t, 0, body)
		w := &Watcher{Source: IMDS{NewClient(f.URL)}, Log: testr.New(t)}
		n, err := w.Poll(context.Background())
		require.Error(t, err, body)
		require.Nil(t, n)
		require.Nil(t, w.Notice())
	}
}

// Without a session token (IMDSv2 unavailable: 403, 404 or 405 to the token
// request, which the SDK would take as a cue to fall back) the client
// never reads metadata tokenless (IMDSv1); fakeIMDS fails the test on such
// a read.
func TestClientNeverFallsBackToIMDSv1(t *testing.T) {
	for _, code := range []int{403, 404, 405} {
		f := newFakeIMDS(t, 0, notice)
		f.tokenStatus = code
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := NewClient(f.URL).GetMetadata(ctx, &imds.GetMetadataInput{Path: InstanceActionPath})
		cancel()
		require.Error(t, err, "token answer %d", code)
		require.Zero(t, f.readCount(), "token answer %d: metadata read without a token", code)
	}
}

// With Detect (NSTANCE_SPOT_NOTICE=auto, the default) the watcher asks the
// metadata whether the instance is spot: on a spot instance it polls and
// reads the notice; on an on-demand one it never polls; without metadata
// (nothing listening) it gives up after a few tries.
func TestWatcherDetectsSpotFromTheMetadata(t *testing.T) {
	for _, tc := range []struct {
		name      string
		lifeCycle string
		closed    bool
		want      bool
	}{
		{"spot", "spot", false, true},
		{"on-demand", "on-demand", false, false},
		{"no instance metadata", "", true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeIMDS(t, 2, notice)
			f.lifeCycle = tc.lifeCycle
			endpoint := f.URL
			if tc.closed {
				f.Close()
			}
			c := imds.New(imds.Options{Endpoint: endpoint, EnableFallback: imdsV1Fallback, Retryer: aws.NopRetryer{}})
			w := &Watcher{Source: IMDS{c}, Interval: 10 * time.Millisecond, Log: testr.New(t), Detect: true}
			done := make(chan struct{})
			go func() { defer close(done); w.Run(context.Background()) }()
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("Run did not return")
			}
			if !tc.want {
				require.Nil(t, w.Notice())
				require.Zero(t, f.readCount(), "instance-action never polled")
				if !tc.closed {
					require.Equal(t, 1, f.lifeCycleReadCount(), "asked once")
				}
				return
			}
			require.NotNil(t, w.Notice())
			require.Equal(t, nstancev1.TerminationKind_TERMINATION_KIND_SPOT, w.Notice().GetKind())
			_, polls := f.counts()
			require.Equal(t, 3, polls, "two 404s, then the notice")
		})
	}
}
