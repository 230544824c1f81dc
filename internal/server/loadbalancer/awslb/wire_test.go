package awslb_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	awssdk "github.com/aws/aws-sdk-go-v2/aws"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	elb "github.com/aws/aws-sdk-go-v2/service/elasticloadbalancingv2"
	"github.com/go-logr/logr"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/internal/server/loadbalancer"
	"github.com/nstance-dev/nstance/internal/server/loadbalancer/awslb"
	awsprov "github.com/nstance-dev/nstance/internal/server/provider/aws"
)

// The wire test runs the provider on the real SDK clients (ELBv2 and EC2)
// against an httptest server playing both Query APIs: each request is
// checked (service in the SigV4 scope, action, version, parameters) and
// answered with the API reference's XML.

type call struct {
	service, action string
	check           func(t *testing.T, f url.Values)
	status          int
	body            string
}

type wireServer struct {
	t      *testing.T
	mu     sync.Mutex
	script []call
	seen   map[string]bool
}

var scope = regexp.MustCompile(`Credential=AKIDWIRE/\d{8}/us-fake-1/([a-z0-9]+)/aws4_request`)

func (w *wireServer) ServeHTTP(rw http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	f, err := url.ParseQuery(string(body))
	assert.NoError(w.t, err)
	m := scope.FindStringSubmatch(r.Header.Get("Authorization"))
	if !assert.Len(w.t, m, 2, "Authorization %q", r.Header.Get("Authorization")) {
		http.Error(rw, "unsigned", http.StatusForbidden)
		return
	}
	service, action := m[1], f.Get("Action")
	w.mu.Lock()
	if service == "elasticloadbalancing" {
		w.seen["elasticloadbalancing:"+action] = true
	}
	if len(w.script) == 0 {
		w.mu.Unlock()
		w.t.Errorf("unexpected %s %s: %v", service, action, f)
		http.Error(rw, "unexpected", http.StatusInternalServerError)
		return
	}
	c := w.script[0]
	w.script = w.script[1:]
	w.mu.Unlock()
	assert.Equal(w.t, c.service+" "+c.action, service+" "+action)
	wantVersion := map[string]string{"ec2": "2016-11-15", "elasticloadbalancing": "2015-12-01"}[service]
	assert.Equal(w.t, wantVersion, f.Get("Version"))
	if c.check != nil {
		c.check(w.t, f)
	}
	rw.Header().Set("Content-Type", "text/xml")
	rw.WriteHeader(c.status)
	_, _ = io.WriteString(rw, c.body)
}

func (w *wireServer) expect(cs ...call) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.script = append(w.script, cs...)
}

func (w *wireServer) done(t *testing.T) {
	t.Helper()
	w.mu.Lock()
	defer w.mu.Unlock()
	require.Empty(t, w.script, "expected requests never came")
}

func elbOK(action, result string) call {
	return call{service: "elasticloadbalancing", action: action, status: http.StatusOK, body: fmt.Sprintf(
		`<%[1]sResponse xmlns="http://elasticloadbalancing.amazonaws.com/doc/2015-12-01/"><%[1]sResult>%[2]s</%[1]sResult>`+
			`<ResponseMetadata><RequestId>req-wire</RequestId></ResponseMetadata></%[1]sResponse>`, action, result)}
}

func elbFail(action string, status int, code, msg string) call {
	return call{service: "elasticloadbalancing", action: action, status: status, body: fmt.Sprintf(
		`<ErrorResponse xmlns="http://elasticloadbalancing.amazonaws.com/doc/2015-12-01/"><Error><Type>Sender</Type><Code>%s</Code>`+
			`<Message>%s</Message></Error><RequestId>req-wire</RequestId></ErrorResponse>`, code, msg)}
}

// ec2Instances answers DescribeInstances with instances (ec2 id, ip, instance id tag).
func ec2Instances(check func(t *testing.T, f url.Values), items ...[3]string) call {
	var b strings.Builder
	b.WriteString(`<DescribeInstancesResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/"><requestId>r</requestId><reservationSet>`)
	for _, it := range items {
		fmt.Fprintf(&b, `<item><reservationId>r-1</reservationId><instancesSet><item><instanceId>%s</instanceId><privateIpAddress>%s</privateIpAddress>`+
			`<instanceState><code>16</code><name>running</name></instanceState><tagSet><item><key>%s</key><value>c1</value></item>`+
			`<item><key>%s</key><value>s1</value></item><item><key>%s</key><value>%s</value></item></tagSet></item></instancesSet></item>`,
			it[0], it[1], awsprov.TagCluster, awsprov.TagShard, awsprov.TagInstanceID, it[2])
	}
	b.WriteString(`</reservationSet></DescribeInstancesResponse>`)
	return call{service: "ec2", action: "DescribeInstances", status: http.StatusOK, body: b.String(), check: check}
}

func ec2Filters(f url.Values) map[string][]string {
	out := map[string][]string{}
	for i := 1; ; i++ {
		name := f.Get(fmt.Sprintf("Filter.%d.Name", i))
		if name == "" {
			return out
		}
		for j := 1; ; j++ {
			v, ok := f[fmt.Sprintf("Filter.%d.Value.%d", i, j)]
			if !ok {
				break
			}
			out[name] = append(out[name], v[0])
		}
	}
}

// policyActions returns the elasticloadbalancing actions the server policy allows.
func policyActions(t *testing.T) []string {
	data, err := os.ReadFile(filepath.Join("..", "..", "..", "..", "deploy", "aws", "iam", "nstance-server-policy.json"))
	require.NoError(t, err)
	var doc struct {
		Statement []struct {
			Effect string
			Action any
		}
	}
	require.NoError(t, json.Unmarshal(data, &doc))
	set := map[string]bool{}
	for _, st := range doc.Statement {
		if st.Effect != "Allow" {
			continue
		}
		var acts []string
		switch a := st.Action.(type) {
		case string:
			acts = []string{a}
		case []any:
			for _, x := range a {
				acts = append(acts, x.(string))
			}
		}
		for _, a := range acts {
			if strings.HasPrefix(a, "elasticloadbalancing:") {
				set[a] = true
			}
		}
	}
	out := make([]string, 0, len(set))
	for a := range set {
		out = append(out, a)
	}
	sort.Strings(out)
	return out
}

func TestWire(t *testing.T) {
	w := &wireServer{t: t, seen: map[string]bool{}}
	srv := httptest.NewServer(w)
	t.Cleanup(srv.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfg, err := awsconfig.LoadDefaultConfig(ctx, awsconfig.WithRegion("us-fake-1"),
		awsconfig.WithCredentialsProvider(credentials.NewStaticCredentialsProvider("AKIDWIRE", "wire-secret", "")),
		awsconfig.WithRetryer(func() awssdk.Retryer { return awsprov.NewRetryer(*awsprov.DefaultOptions()) }))
	require.NoError(t, err)
	elbClient := elb.NewFromConfig(cfg, func(o *elb.Options) { o.BaseEndpoint = awssdk.String(srv.URL) })
	ec2Client := ec2.NewFromConfig(cfg, func(o *ec2.Options) { o.BaseEndpoint = awssdk.String(srv.URL) })
	s := awslb.Settings{TargetGroupARNs: []string{arnA, arnB}, TargetType: awslb.TargetInstance, Port: 8080}
	p := awslb.New(elbClient, ec2Client, s, loadbalancer.Env{Name: "www", Config: testConfig, Log: logr.Discard()})
	target := func(arn, id string) func(t *testing.T, f url.Values) {
		return func(t *testing.T, f url.Values) {
			assert.Equal(t, arn, f.Get("TargetGroupArn"))
			assert.Equal(t, id, f.Get("Targets.member.1.Id"))
			assert.Equal(t, "8080", f.Get("Targets.member.1.Port"))
		}
	}

	// Register: the EC2 id by the ownership tags, then both groups; the
	// first RegisterTargets is throttled and retried by the SDK.
	w.expect(
		ec2Instances(func(t *testing.T, f url.Values) {
			assert.Equal(t, map[string][]string{"tag:" + awsprov.TagCluster: {"c1"}, "tag:" + awsprov.TagShard: {"s1"},
				"instance-state-name": {"pending", "running", "stopping", "stopped"}, "tag:" + awsprov.TagInstanceID: {"web-00000001"}}, ec2Filters(f))
		}, [3]string{"i-0wire1", "10.0.1.12", "web-00000001"}),
		elbFail("RegisterTargets", http.StatusBadRequest, "Throttling", "Rate exceeded"),
		withCheck(elbOK("RegisterTargets", ""), target(arnA, "i-0wire1")),
		withCheck(elbOK("RegisterTargets", ""), target(arnB, "i-0wire1")),
	)
	require.NoError(t, p.Register(ctx, loadbalancer.Target{InstanceID: "web-00000001"}))
	w.done(t)

	// A terminated instance is refused by ELBv2.
	w.expect(ec2Instances(nil, [3]string{"i-0gone", "10.0.1.13", "web-00000002"}),
		elbFail("RegisterTargets", http.StatusBadRequest, "InvalidTarget", "The following targets are not in a running state and cannot be registered: 'i-0gone'"))
	require.ErrorContains(t, p.Register(ctx, loadbalancer.Target{InstanceID: "web-00000002"}), "InvalidTarget")
	w.done(t)

	// Members: both groups' health, matched by one DescribeInstances.
	health := func(items ...[2]string) string {
		var b strings.Builder
		b.WriteString(`<TargetHealthDescriptions>`)
		for _, it := range items {
			fmt.Fprintf(&b, `<member><Target><Id>%s</Id><Port>8080</Port></Target><HealthCheckPort>8080</HealthCheckPort>`+
				`<TargetHealth><State>%s</State></TargetHealth></member>`, it[0], it[1])
		}
		b.WriteString(`</TargetHealthDescriptions>`)
		return b.String()
	}
	w.expect(
		withCheck(elbOK("DescribeTargetHealth", health([2]string{"i-0wire1", "healthy"}, [2]string{"i-0foreign", "healthy"})),
			func(t *testing.T, f url.Values) { assert.Equal(t, arnA, f.Get("TargetGroupArn")) }),
		elbOK("DescribeTargetHealth", health([2]string{"i-0wire1", "draining"})),
		ec2Instances(func(t *testing.T, f url.Values) {
			assert.Equal(t, []string{"i-0foreign", "i-0wire1"}, ec2Filters(f)["instance-id"])
		}, [3]string{"i-0wire1", "10.0.1.12", "web-00000001"}),
	)
	ms, err := p.Members(ctx)
	require.NoError(t, err)
	require.Equal(t, []loadbalancer.Member{{InstanceID: "web-00000001", State: loadbalancer.MemberDraining, Detail: "healthy,draining"}}, ms)
	w.done(t)

	// Deregister (the EC2 id remembered): both groups; an unknown target is done.
	w.expect(
		withCheck(elbOK("DeregisterTargets", ""), target(arnA, "i-0wire1")),
		elbFail("DeregisterTargets", http.StatusBadRequest, "InvalidTarget", "The target is not registered"),
	)
	require.NoError(t, p.Deregister(ctx, loadbalancer.Target{InstanceID: "web-00000001"}))
	w.done(t)

	// The delay: the longest attribute of the groups.
	attrs := func(secs string) string {
		return `<Attributes><member><Key>stickiness.enabled</Key><Value>false</Value></member>` +
			`<member><Key>deregistration_delay.timeout_seconds</Key><Value>` + secs + `</Value></member></Attributes>`
	}
	w.expect(
		withCheck(elbOK("DescribeTargetGroupAttributes", attrs("300")), func(t *testing.T, f url.Values) { assert.Equal(t, arnA, f.Get("TargetGroupArn")) }),
		elbOK("DescribeTargetGroupAttributes", attrs("45")),
	)
	d, err := p.DeregistrationDelay(ctx)
	require.NoError(t, err)
	require.Equal(t, 300*time.Second, d)
	w.done(t)

	// The ELBv2 actions the provider calls are exactly the ones the server
	// policy grants, and the ones its API interface names.
	var seen []string
	for a := range w.seen {
		seen = append(seen, a)
	}
	sort.Strings(seen)
	require.Equal(t, awslb.IAMActions(), seen)
	require.Equal(t, policyActions(t), seen)
}

func withCheck(c call, f func(t *testing.T, f url.Values)) call {
	c.check = f
	return c
}
