package aws_test

import (
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/feature/ec2/imds"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/nstance-dev/nstance/internal/config"
	"github.com/nstance-dev/nstance/internal/server/provider"
	"github.com/nstance-dev/nstance/internal/server/provider/aws"
)

// The wire tests run the provider and the ENI holder on the real SDK client
// against an httptest server that plays EC2's Query API: each expected
// request is checked (action, API version, parameters, SigV4 signature
// headers) and answered with the XML shape of the EC2 API reference, so
// request serialization, signing, retries and response parsing all run.

const wireRegion = "us-fake-1"

// exchange is one expected request and its answer. Checks run on the
// server's goroutine, so they use assert (never FailNow).
type exchange struct {
	action string
	check  func(t *testing.T, form url.Values)
	status int
	body   string
}

type wire struct {
	t      *testing.T
	mu     sync.Mutex
	script []exchange
	served int
	seen   map[string]bool
	url    string
}

var (
	authPattern = regexp.MustCompile(`^AWS4-HMAC-SHA256 Credential=AKIDWIRE/\d{8}/` + wireRegion + `/ec2/aws4_request, SignedHeaders=[a-z0-9;-]*host[a-z0-9;-]*, Signature=[0-9a-f]{64}$`)
	datePattern = regexp.MustCompile(`^\d{8}T\d{6}Z$`)
)

func (w *wire) ServeHTTP(rw http.ResponseWriter, r *http.Request) {
	t := w.t
	body, _ := io.ReadAll(r.Body)
	form, err := url.ParseQuery(string(body))
	if err != nil {
		t.Errorf("request body is not a query string: %v", err)
	}
	if r.Method != http.MethodPost || !strings.HasPrefix(r.Header.Get("Content-Type"), "application/x-www-form-urlencoded") {
		t.Errorf("%s %s with Content-Type %q: want a form POST", r.Method, r.URL, r.Header.Get("Content-Type"))
	}
	if a := r.Header.Get("Authorization"); !authPattern.MatchString(a) || !strings.Contains(a, "x-amz-date") {
		t.Errorf("Authorization %q is not a SigV4 signature of the static key for %s/ec2", a, wireRegion)
	}
	if d := r.Header.Get("X-Amz-Date"); !datePattern.MatchString(d) {
		t.Errorf("X-Amz-Date %q", d)
	}
	if v := form.Get("Version"); v != "2016-11-15" {
		t.Errorf("Version %q, want the EC2 API version 2016-11-15", v)
	}
	action := form.Get("Action")
	w.mu.Lock()
	w.seen[action] = true
	if len(w.script) == 0 {
		w.mu.Unlock()
		t.Errorf("unexpected %s request: %v", action, form)
		http.Error(rw, "unexpected", http.StatusInternalServerError)
		return
	}
	ex := w.script[0]
	w.script = w.script[1:]
	w.served++
	w.mu.Unlock()
	if ex.action != action {
		t.Errorf("request %d: got %s, want %s (%v)", w.served, action, ex.action, form)
	}
	if ex.check != nil {
		ex.check(t, form)
	}
	rw.Header().Set("Content-Type", "text/xml;charset=UTF-8")
	rw.Header().Set("x-amzn-RequestId", "req-wire")
	rw.WriteHeader(ex.status)
	_, _ = io.WriteString(rw, ex.body)
}

// expect queues exchanges; done checks the script was played out.
func (w *wire) expect(ex ...exchange) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.script = append(w.script, ex...)
}

func (w *wire) done(t *testing.T) {
	t.Helper()
	w.mu.Lock()
	defer w.mu.Unlock()
	var left []string
	for _, ex := range w.script {
		left = append(left, ex.action)
	}
	require.Empty(t, left, "expected requests never came")
}

func ok(action, inner string) exchange {
	return exchange{action: action, status: http.StatusOK, body: fmt.Sprintf(
		`<?xml version="1.0" encoding="UTF-8"?>`+"\n"+`<%[1]sResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/"><requestId>req-wire</requestId>%[2]s</%[1]sResponse>`, action, inner)}
}

func fail(action string, status int, code, msg string) exchange {
	return exchange{action: action, status: status, body: fmt.Sprintf(
		`<?xml version="1.0" encoding="UTF-8"?>`+"\n"+`<Response><Errors><Error><Code>%s</Code><Message>%s</Message></Error></Errors><RequestID>req-wire</RequestID></Response>`, code, msg)}
}

func (ex exchange) checking(f func(t *testing.T, form url.Values)) exchange {
	ex.check = f
	return ex
}

// instanceXML is one instancesSet item.
func instanceXML(ec2ID, id, state string, code int, spot bool) string {
	var b strings.Builder
	fmt.Fprintf(&b, `<item><instanceId>%s</instanceId><imageId>ami-0123456789abcdef0</imageId>`, ec2ID)
	fmt.Fprintf(&b, `<instanceState><code>%d</code><name>%s</name></instanceState>`, code, state)
	b.WriteString(`<privateDnsName>ip-10-0-1-12.us-fake-1.compute.internal</privateDnsName><instanceType>m7g.large</instanceType>`)
	b.WriteString(`<launchTime>2026-11-24T08:00:00.000Z</launchTime><placement><availabilityZone>us-fake-1a</availabilityZone><tenancy>default</tenancy></placement>`)
	b.WriteString(`<subnetId>subnet-a</subnetId><vpcId>vpc-1</vpcId><privateIpAddress>10.0.1.12</privateIpAddress><ipAddress>203.0.113.7</ipAddress>`)
	if spot {
		b.WriteString(`<instanceLifecycle>spot</instanceLifecycle><spotInstanceRequestId>sir-1</spotInstanceRequestId>`)
	}
	if state == "pending" {
		b.WriteString(`<stateReason><code>pending</code><message>pending</message></stateReason>`)
	}
	fmt.Fprintf(&b, `<tagSet><item><key>%s</key><value>c1</value></item><item><key>%s</key><value>s1</value></item>`, aws.TagCluster, aws.TagShard)
	fmt.Fprintf(&b, `<item><key>%s</key><value>%s</value></item><item><key>%s</key><value>%s</value></item></tagSet>`,
		aws.TagInstanceID, id, aws.TagProviderID, provider.ID("c1", "s1", id))
	b.WriteString(`<networkInterfaceSet><item><networkInterfaceId>eni-primary</networkInterfaceId><subnetId>subnet-a</subnetId><status>in-use</status>`)
	b.WriteString(`<privateIpAddress>10.0.1.12</privateIpAddress><privateIpAddressesSet><item><privateIpAddress>10.0.1.12</privateIpAddress><primary>true</primary></item>`)
	b.WriteString(`<item><privateIpAddress>10.0.1.13</privateIpAddress><primary>false</primary></item></privateIpAddressesSet>`)
	b.WriteString(`<ipv6AddressesSet><item><ipv6Address>2600:1f18::12</ipv6Address></item></ipv6AddressesSet></item></networkInterfaceSet>`)
	b.WriteString(`</item>`)
	return b.String()
}

func subnetItem(id string, free int) string {
	return fmt.Sprintf(`<item><subnetId>%s</subnetId><state>available</state><vpcId>vpc-1</vpcId><availabilityZone>us-fake-1a</availabilityZone>`+
		`<availableIpAddressCount>%d</availableIpAddressCount><cidrBlock>10.0.1.0/24</cidrBlock></item>`, id, free)
}

func subnetsXML(id string, free int) string {
	return `<subnetSet>` + subnetItem(id, free) + `</subnetSet>`
}

func imageXML(id, name, created string) string {
	return fmt.Sprintf(`<item><imageId>%s</imageId><name>%s</name><imageState>available</imageState><architecture>arm64</architecture>`+
		`<creationDate>%s</creationDate><imageOwnerId>123456789012</imageOwnerId></item>`, id, name, created)
}

func reservations(items ...string) string {
	var b strings.Builder
	b.WriteString(`<reservationSet>`)
	for i, it := range items {
		fmt.Fprintf(&b, `<item><reservationId>r-%d</reservationId><ownerId>123456789012</ownerId><groupSet/><instancesSet>%s</instancesSet></item>`, i, it)
	}
	b.WriteString(`</reservationSet>`)
	return b.String()
}

// params returns the values of a serialized list (Name.1, Name.2, …).
func params(form url.Values, name string) []string {
	var out []string
	for i := 1; ; i++ {
		v, ok := form[fmt.Sprintf("%s.%d", name, i)]
		if !ok {
			return out
		}
		out = append(out, v[0])
	}
}

// filters decodes Filter.N.Name / Filter.N.Value.M.
func filters(form url.Values) map[string][]string {
	out := map[string][]string{}
	for i := 1; ; i++ {
		name := form.Get(fmt.Sprintf("Filter.%d.Name", i))
		if name == "" {
			return out
		}
		out[name] = params(form, fmt.Sprintf("Filter.%d.Value", i))
	}
}

// tagSpec decodes TagSpecification.N.Tag.M.{Key,Value} of one resource type.
func tagSpec(form url.Values, resource string) map[string]string {
	for i := 1; ; i++ {
		rt := form.Get(fmt.Sprintf("TagSpecification.%d.ResourceType", i))
		if rt == "" {
			return nil
		}
		if rt != resource {
			continue
		}
		out := map[string]string{}
		for j := 1; ; j++ {
			k := form.Get(fmt.Sprintf("TagSpecification.%d.Tag.%d.Key", i, j))
			if k == "" {
				return out
			}
			out[k] = form.Get(fmt.Sprintf("TagSpecification.%d.Tag.%d.Value", i, j))
		}
	}
}

func wireClient(t *testing.T, w *wire) *ec2.Client {
	t.Helper()
	srv := httptest.NewServer(w)
	t.Cleanup(srv.Close)
	w.url = srv.URL
	// Nothing from the machine's AWS set-up may leak in.
	dir := t.TempDir()
	for k, v := range map[string]string{"AWS_CONFIG_FILE": filepath.Join(dir, "config"), "AWS_SHARED_CREDENTIALS_FILE": filepath.Join(dir, "credentials"),
		"AWS_PROFILE": "", "AWS_ENDPOINT_URL": "", "AWS_ENDPOINT_URL_EC2": "", "AWS_REGION": "", "AWS_RETRY_MODE": "", "AWS_MAX_ATTEMPTS": ""} {
		t.Setenv(k, v)
	}
	o := aws.DefaultOptions()
	o.Endpoint = srv.URL
	o.MaxBackoff = config.Duration(5 * time.Millisecond)
	client, err := aws.NewClient(context.Background(), *o, wireRegion,
		awsconfig.WithCredentialsProvider(credentials.NewStaticCredentialsProvider("AKIDWIRE", "wire-secret", "")))
	require.NoError(t, err)
	return client
}

func TestWire(t *testing.T) {
	w := &wire{t: t, seen: map[string]bool{}}
	client := wireClient(t, w)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	t.Run("provider", func(t *testing.T) {
		o := aws.DefaultOptions()
		o.ImageID, o.SecurityGroupIDs, o.IAMInstanceProfile = "ami-0123456789abcdef0", []string{"sg-1", "sg-2"}, "nstance-agent"
		o.VisibilityTimeout = config.Duration(10 * time.Second)
		cfg := testConfig()
		cfg.Shard.SubnetPools["default"] = config.SubnetPool{Subnets: []string{"subnet-a"}}
		p := aws.New(client, *o, provider.Env{Config: func() *config.Config { return cfg }})
		p.Visible = wait.Backoff{Duration: time.Millisecond, Factor: 2, Steps: 5, Cap: 10 * time.Millisecond}

		req := request("web-1", "web")
		req.Args = map[string]string{aws.ArgMarket: aws.MarketSpot, aws.ArgSpotMaxPrice: "0.05"}
		checkRun := func(t *testing.T, f url.Values) {
			assert.Equal(t, "web-1", f.Get("ClientToken"))
			assert.Equal(t, "ami-0123456789abcdef0", f.Get("ImageId"))
			assert.Equal(t, "m7g.large", f.Get("InstanceType"))
			assert.Equal(t, "1", f.Get("MinCount"))
			assert.Equal(t, "1", f.Get("MaxCount"))
			assert.Equal(t, "subnet-a", f.Get("SubnetId"))
			assert.Equal(t, []string{"sg-1", "sg-2"}, params(f, "SecurityGroupId"))
			assert.Equal(t, "nstance-agent", f.Get("IamInstanceProfile.Name"))
			assert.Equal(t, "required", f.Get("MetadataOptions.HttpTokens"))
			assert.Equal(t, "1", f.Get("MetadataOptions.HttpPutResponseHopLimit"), "pods get no IMDS token")
			assert.Equal(t, "enabled", f.Get("MetadataOptions.HttpEndpoint"))
			assert.Equal(t, "spot", f.Get("InstanceMarketOptions.MarketType"))
			assert.Equal(t, "0.05", f.Get("InstanceMarketOptions.SpotOptions.MaxPrice"))
			assert.Equal(t, "one-time", f.Get("InstanceMarketOptions.SpotOptions.SpotInstanceType"))
			assert.Equal(t, "terminate", f.Get("InstanceMarketOptions.SpotOptions.InstanceInterruptionBehavior"))
			tags := tagSpec(f, "instance")
			assert.Equal(t, "web-1", tags[aws.TagInstanceID])
			assert.Equal(t, "c1", tags[aws.TagCluster])
			assert.Equal(t, "nstance://c1/s1/web-1", tags[aws.TagProviderID])
			assert.Equal(t, tags, tagSpec(f, "volume"))
			ud, err := base64.StdEncoding.DecodeString(f.Get("UserData"))
			assert.NoError(t, err)
			assert.Contains(t, string(ud), "#!/bin/sh")
			assert.Contains(t, string(ud), base64.StdEncoding.EncodeToString([]byte("nonce-web-1")))
		}
		byID := func(id string) func(t *testing.T, f url.Values) {
			return func(t *testing.T, f url.Values) {
				assert.Equal(t, []string{id}, params(f, "InstanceId"))
			}
		}
		byGroup := func(group string) func(t *testing.T, f url.Values) {
			return func(t *testing.T, f url.Values) {
				assert.Equal(t, map[string][]string{"tag:" + aws.TagCluster: {"c1"}, "tag:" + aws.TagShard: {"s1"},
					"instance-state-name": {"pending", "running", "stopping", "stopped"},
					"tag:" + aws.TagGroup: {group}, "tag:" + aws.TagTenant: {"acme"}}, filters(f))
			}
		}
		byTags := func(instanceID, token string) func(t *testing.T, f url.Values) {
			return func(t *testing.T, f url.Values) {
				want := map[string][]string{"tag:" + aws.TagCluster: {"c1"}, "tag:" + aws.TagShard: {"s1"},
					"instance-state-name": {"pending", "running", "stopping", "stopped"}}
				if instanceID != "" {
					want["tag:"+aws.TagInstanceID] = []string{instanceID}
				}
				assert.Equal(t, want, filters(f))
				assert.Equal(t, token, f.Get("NextToken"))
			}
		}

		// Create: the pool's free addresses and the group's members per
		// subnet pick the subnet; RunInstances is throttled twice (the SDK
		// retryer resends the same request), then launches; the first
		// look does not see it yet.
		w.expect(
			ok("DescribeSubnets", subnetsXML("subnet-a", 250)).checking(func(t *testing.T, f url.Values) {
				assert.Equal(t, []string{"subnet-a"}, params(f, "SubnetId"))
			}),
			ok("DescribeInstances", `<reservationSet/>`).checking(byGroup("web")),
			fail("RunInstances", http.StatusServiceUnavailable, "RequestLimitExceeded", "Request limit exceeded.").checking(checkRun),
			fail("RunInstances", http.StatusServiceUnavailable, "RequestLimitExceeded", "Request limit exceeded.").checking(checkRun),
			ok("RunInstances", `<reservationId>r-1</reservationId><ownerId>123456789012</ownerId><groupSet/><instancesSet>`+
				instanceXML("i-0wire1", "web-1", "pending", 0, true)+`</instancesSet>`).checking(checkRun),
			fail("DescribeInstances", http.StatusBadRequest, "InvalidInstanceID.NotFound", "The instance ID 'i-0wire1' does not exist").checking(byID("i-0wire1")),
			ok("DescribeInstances", reservations(instanceXML("i-0wire1", "web-1", "running", 16, true))).checking(byID("i-0wire1")),
		)
		inst, err := p.Create(ctx, req)
		require.NoError(t, err)
		w.done(t)
		require.Equal(t, provider.Instance{InstanceID: "web-1", ProviderID: "nstance://c1/s1/web-1", State: provider.StateRunning,
			Message: "ec2 i-0wire1 running; spot", Addresses: []string{"10.0.1.12", "10.0.1.13", "2600:1f18::12", "203.0.113.7"}}, inst)

		// A parameter error is not retried. The free addresses are cached.
		w.expect(ok("DescribeInstances", reservations(instanceXML("i-0wire1", "web-1", "running", 16, false))).checking(byGroup("web")),
			fail("RunInstances", http.StatusBadRequest, "InvalidParameterValue", "Value (m7g.huge) for parameter instanceType is invalid."))
		bad := request("web-2", "web")
		_, err = p.Create(ctx, bad)
		require.ErrorContains(t, err, "InvalidParameterValue")
		w.done(t)

		// Status by ownership tags.
		w.expect(ok("DescribeInstances", reservations(instanceXML("i-0wire1", "web-1", "pending", 0, false))).checking(byTags("web-1", "")))
		st, err := p.Status(ctx, "web-1")
		require.NoError(t, err)
		require.Equal(t, provider.StatePending, st.State)
		require.Equal(t, "ec2 i-0wire1 pending; pending", st.Message)
		w.done(t)

		// List over two pages.
		w.expect(
			ok("DescribeInstances", reservations(instanceXML("i-0wire2", "web-2", "stopped", 80, false))+`<nextToken>page-2</nextToken>`).checking(byTags("", "")),
			ok("DescribeInstances", reservations(instanceXML("i-0wire1", "web-1", "running", 16, false))).checking(byTags("", "page-2")),
		)
		list, err := p.List(ctx)
		require.NoError(t, err)
		require.Len(t, list, 2)
		require.Equal(t, "web-1", list[0].InstanceID)
		require.Equal(t, provider.StateStopped, list[1].State)
		w.done(t)

		// Delete: find by tag, terminate.
		w.expect(
			ok("DescribeInstances", reservations(instanceXML("i-0wire1", "web-1", "running", 16, false))).checking(byTags("web-1", "")),
			ok("TerminateInstances", `<instancesSet><item><instanceId>i-0wire1</instanceId><currentState><code>32</code><name>shutting-down</name></currentState>`+
				`<previousState><code>16</code><name>running</name></previousState></item></instancesSet>`).checking(byID("i-0wire1")),
		)
		require.NoError(t, p.Delete(ctx, "web-1"))
		w.done(t)

		// Gone: an empty answer is ErrNotFound, and deleting again asks
		// EC2 nothing but the lookup.
		w.expect(ok("DescribeInstances", `<reservationSet/>`).checking(byTags("web-1", "")))
		_, err = p.Status(ctx, "web-1")
		require.ErrorIs(t, err, provider.ErrNotFound)
		w.expect(ok("DescribeInstances", `<reservationSet/>`).checking(byTags("web-1", "")))
		require.NoError(t, p.Delete(ctx, "web-1"))
		w.done(t)
	})

	t.Run("standard retry mode", func(t *testing.T) {
		// max_attempts bounds the SDK's tries: two throttled answers with
		// max_attempts 2 fail the call; the third request never comes.
		o := aws.DefaultOptions()
		o.Endpoint, o.RetryMode, o.MaxAttempts, o.MaxBackoff = w.url, aws.RetryStandard, 2, config.Duration(time.Millisecond)
		c, err := aws.NewClient(ctx, *o, wireRegion, awsconfig.WithCredentialsProvider(credentials.NewStaticCredentialsProvider("AKIDWIRE", "wire-secret", "")))
		require.NoError(t, err)
		p := aws.New(c, *o, provider.Env{Config: testConfig})
		w.expect(
			fail("DescribeInstances", http.StatusServiceUnavailable, "RequestLimitExceeded", "Request limit exceeded."),
			fail("DescribeInstances", http.StatusServiceUnavailable, "RequestLimitExceeded", "Request limit exceeded."),
		)
		_, err = p.List(ctx)
		require.ErrorContains(t, err, "RequestLimitExceeded")
		require.ErrorContains(t, err, "exceeded maximum number of attempts, 2")
		w.done(t)
	})

	t.Run("registry", func(t *testing.T) {
		// The assembly's path: the options block through the registry to
		// a provider with its own client (credentials from the environment).
		t.Setenv("AWS_ACCESS_KEY_ID", "AKIDWIRE")
		t.Setenv("AWS_SECRET_ACCESS_KEY", "wire-secret")
		cfg := testConfig()
		cfg.Shard.Infra.Region = wireRegion
		cfg.Shard.Infra.Options = map[string]any{"endpoint": w.url, "image_id": "ami-1", "max_backoff": "5ms"}
		p, err := provider.NewRegistry(aws.Kind()).New(ctx, provider.Env{Config: func() *config.Config { return cfg }})
		require.NoError(t, err)
		w.expect(ok("DescribeInstances", reservations(instanceXML("i-0wire1", "web-1", "running", 16, false))))
		list, err := p.List(ctx)
		require.NoError(t, err)
		require.Len(t, list, 1)
		w.done(t)
	})

	t.Run("eni from the metadata service", func(t *testing.T) {
		// IMDSv2: a session token first, then the instance identity
		// document (instance id, region) with it.
		md := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
			switch {
			case r.Method == http.MethodPut && r.URL.Path == "/latest/api/token":
				if r.Header.Get("X-Aws-Ec2-Metadata-Token-Ttl-Seconds") == "" {
					t.Errorf("token request without a TTL")
				}
				rw.Header().Set("X-Aws-Ec2-Metadata-Token-Ttl-Seconds", r.Header.Get("X-Aws-Ec2-Metadata-Token-Ttl-Seconds"))
				_, _ = io.WriteString(rw, "md-token")
				return
			case r.Header.Get("X-Aws-Ec2-Metadata-Token") != "md-token":
				t.Errorf("%s %s without the session token", r.Method, r.URL.Path)
				http.Error(rw, "unauthorized", http.StatusUnauthorized)
			case r.URL.Path == "/latest/dynamic/instance-identity/document":
				_, _ = io.WriteString(rw, `{"accountId": "123456789012", "architecture": "arm64", "availabilityZone": "us-fake-1a",
  "imageId": "ami-server", "instanceId": "i-0self", "instanceType": "m7g.medium", "pendingTime": "2026-11-24T08:00:00Z",
  "privateIp": "10.0.1.20", "region": "`+wireRegion+`", "version": "2017-09-30"}`)
			default:
				http.NotFound(rw, r)
			}
		}))
		t.Cleanup(md.Close)
		o := aws.DefaultOptions()
		o.Endpoint = w.url
		e, err := aws.NewENI(ctx, aws.ENIConfig{NetworkInterfaceID: "eni-0shard", Options: o, IMDS: imds.New(imds.Options{Endpoint: md.URL})},
			awsconfig.WithCredentialsProvider(credentials.NewStaticCredentialsProvider("AKIDWIRE", "wire-secret", "")))
		require.NoError(t, err)
		require.Equal(t, "i-0self", e.InstanceID)
		// The client signs for the metadata service's region (the
		// handler's Authorization check) and the holder releases nothing
		// it does not hold.
		w.expect(ok("DescribeNetworkInterfaces", `<networkInterfaceSet><item><networkInterfaceId>eni-0shard</networkInterfaceId><status>available</status></item></networkInterfaceSet>`))
		require.NoError(t, e.Release(ctx))
		w.done(t)

		_, err = aws.NewENI(ctx, aws.ENIConfig{NetworkInterfaceID: "eni-0shard", Region: wireRegion, InstanceID: "web-1"})
		require.ErrorContains(t, err, `instance id "web-1" is not i-`)
	})

	t.Run("eni", func(t *testing.T) {
		e := &aws.ENI{API: client, NetworkInterfaceID: "eni-0shard", InstanceID: "i-0self",
			Backoff: wait.Backoff{Duration: time.Millisecond, Factor: 2, Cap: 5 * time.Millisecond}}
		eniXML := func(attachment string) string {
			status := "available"
			if attachment != "" {
				status = "in-use"
			}
			return `<networkInterfaceSet><item><networkInterfaceId>eni-0shard</networkInterfaceId><subnetId>subnet-a</subnetId><vpcId>vpc-1</vpcId>` +
				`<availabilityZone>us-fake-1a</availabilityZone><description>shard s1 leader</description><ownerId>123456789012</ownerId>` +
				`<requesterManaged>false</requesterManaged><status>` + status + `</status><macAddress>02:00:00:00:00:01</macAddress>` +
				`<privateIpAddress>10.0.0.5</privateIpAddress><sourceDestCheck>true</sourceDestCheck><interfaceType>interface</interfaceType>` +
				attachment + `<tagSet/></item></networkInterfaceSet>`
		}
		attached := func(id, instance, status string) string {
			return `<attachment><attachmentId>` + id + `</attachmentId><instanceId>` + instance + `</instanceId><instanceOwnerId>123456789012</instanceOwnerId>` +
				`<deviceIndex>1</deviceIndex><status>` + status + `</status><attachTime>2026-11-24T08:00:00.000Z</attachTime><deleteOnTermination>false</deleteOnTermination></attachment>`
		}
		byENI := func(t *testing.T, f url.Values) {
			assert.Equal(t, []string{"eni-0shard"}, params(f, "NetworkInterfaceId"))
		}

		// Failover: the ENI is still attached to the dead leader.
		w.expect(
			ok("DescribeNetworkInterfaces", eniXML(attached("eni-attach-old", "i-0old", "attached"))).checking(byENI),
			ok("DetachNetworkInterface", `<return>true</return>`).checking(func(t *testing.T, f url.Values) {
				assert.Equal(t, "eni-attach-old", f.Get("AttachmentId"))
				assert.Equal(t, "true", f.Get("Force"))
			}),
			ok("DescribeNetworkInterfaces", eniXML(attached("eni-attach-old", "i-0old", "detaching"))).checking(byENI),
			fail("DetachNetworkInterface", http.StatusBadRequest, "InvalidAttachmentID.NotFound", "The attachment ID 'eni-attach-old' does not exist"),
			ok("DescribeNetworkInterfaces", eniXML("")).checking(byENI),
			ok("AttachNetworkInterface", `<attachmentId>eni-attach-new</attachmentId><networkCardIndex>0</networkCardIndex>`).checking(func(t *testing.T, f url.Values) {
				assert.Equal(t, "eni-0shard", f.Get("NetworkInterfaceId"))
				assert.Equal(t, "i-0self", f.Get("InstanceId"))
				assert.Equal(t, "1", f.Get("DeviceIndex"))
			}),
			ok("DescribeNetworkInterfaces", eniXML(attached("eni-attach-new", "i-0self", "attaching"))).checking(byENI),
			ok("DescribeNetworkInterfaces", eniXML(attached("eni-attach-new", "i-0self", "attached"))).checking(byENI),
		)
		require.NoError(t, e.Acquire(ctx))
		w.done(t)

		// Step-down: a plain (not forced) detach, done once EC2 reports it.
		w.expect(
			ok("DescribeNetworkInterfaces", eniXML(attached("eni-attach-new", "i-0self", "attached"))).checking(byENI),
			ok("DetachNetworkInterface", `<return>true</return>`).checking(func(t *testing.T, f url.Values) {
				assert.Equal(t, "eni-attach-new", f.Get("AttachmentId"))
				assert.Empty(t, f.Get("Force"))
			}),
			ok("DescribeNetworkInterfaces", eniXML(attached("eni-attach-new", "i-0self", "detaching"))).checking(byENI),
			ok("DescribeNetworkInterfaces", eniXML("")).checking(byENI),
		)
		require.NoError(t, e.Release(ctx))
		w.done(t)

		// A configuration error surfaces at once.
		w.expect(fail("DescribeNetworkInterfaces", http.StatusBadRequest, "InvalidNetworkInterfaceID.NotFound", "The networkInterface ID 'eni-0shard' does not exist"))
		require.ErrorContains(t, e.Acquire(ctx), "InvalidNetworkInterfaceID.NotFound")
		w.done(t)
	})

	t.Run("images and subnet pools", func(t *testing.T) {
		o := aws.DefaultOptions()
		o.Images = map[string]aws.Image{"base": {Name: "nstance-base-*", Owners: []string{"self", "123456789012"}, Architecture: "arm64"}}
		o.SubnetMinFreeAddresses = 10
		cfg := testConfig()
		cfg.Shard.SubnetPools = nil
		cfg.Shard.DynamicSubnetPools = map[string]config.DynamicSubnetPool{"tagged": {Tags: map[string]string{"tier": "private", "nstance.dev/cluster": "c1"}}}
		p := aws.New(client, *o, provider.Env{Config: func() *config.Config { return cfg }})

		// The newest available match of the name, owners and architecture.
		w.expect(ok("DescribeImages", `<imagesSet>`+imageXML("ami-0older", "nstance-base-1", "2026-10-01T00:00:00.000Z")+
			imageXML("ami-0newer", "nstance-base-2", "2026-11-01T00:00:00.000Z")+`</imagesSet>`).checking(func(t *testing.T, f url.Values) {
			assert.Equal(t, []string{"self", "123456789012"}, params(f, "Owner"))
			assert.Equal(t, map[string][]string{"name": {"nstance-base-*"}, "state": {"available"}, "architecture": {"arm64"}}, filters(f))
		}))
		id, err := p.ResolveImage(ctx, "base")
		require.NoError(t, err)
		require.Equal(t, "ami-0newer", id)
		w.done(t)
		w.expect(fail("DescribeImages", http.StatusForbidden, "UnauthorizedOperation", "You are not authorized to perform this operation."))
		_, err = p.ResolveImage(ctx, "base")
		require.ErrorContains(t, err, "UnauthorizedOperation")
		w.done(t)

		// A dynamic pool: its subnets by tags, the fullest below the floor.
		w.expect(
			ok("DescribeSubnets", `<subnetSet>`+subnetItem("subnet-full", 3)+subnetItem("subnet-room", 40)+`</subnetSet>`).checking(func(t *testing.T, f url.Values) {
				assert.Equal(t, map[string][]string{"tag:nstance.dev/cluster": {"c1"}, "tag:tier": {"private"}}, filters(f))
			}),
			ok("DescribeInstances", `<reservationSet/>`),
			ok("RunInstances", `<reservationId>r-2</reservationId><ownerId>123456789012</ownerId><groupSet/><instancesSet>`+
				instanceXML("i-0wire3", "web-3", "running", 16, false)+`</instancesSet>`).checking(func(t *testing.T, f url.Values) {
				assert.Equal(t, "subnet-room", f.Get("SubnetId"))
				assert.Equal(t, "ami-0newer", f.Get("ImageId"))
			}),
			ok("DescribeInstances", reservations(instanceXML("i-0wire3", "web-3", "running", 16, false))),
		)
		req := request("web-3", "web")
		req.SubnetPool, req.Args = "tagged", map[string]string{provider.ArgImageName: "base", provider.ArgImage: "ami-0newer"}
		_, err = p.Create(ctx, req)
		require.NoError(t, err)
		w.done(t)
	})

	t.Run("instance types", func(t *testing.T) {
		p := aws.New(client, *aws.DefaultOptions(), provider.Env{Config: testConfig})
		w.expect(
			ok("DescribeInstanceTypes", `<instanceTypeSet><item><instanceType>g4dn.xlarge</instanceType>`+
				`<vCpuInfo><defaultVCpus>4</defaultVCpus></vCpuInfo><memoryInfo><sizeInMiB>16384</sizeInMiB></memoryInfo>`+
				`<processorInfo><supportedArchitectures><item>x86_64</item></supportedArchitectures></processorInfo>`+
				`<gpuInfo><gpus><item><name>T4</name><manufacturer>NVIDIA</manufacturer><count>1</count></item></gpus></gpuInfo>`+
				`<instanceStorageSupported>true</instanceStorageSupported><instanceStorageInfo><totalSizeInGB>125</totalSizeInGB></instanceStorageInfo>`+
				`</item></instanceTypeSet>`).checking(func(t *testing.T, f url.Values) {
				assert.Equal(t, []string{"g4dn.xlarge"}, params(f, "InstanceType"))
			}),
		)
		it, err := p.DescribeInstanceType(ctx, "g4dn.xlarge")
		require.NoError(t, err)
		require.Equal(t, provider.InstanceType{Name: "g4dn.xlarge", VCPUs: 4, MemoryMiB: 16384, GPUs: 1, EphemeralStorageGiB: 116,
			Pods: provider.DefaultMaxPods, Architecture: "amd64", OperatingSystem: "linux"}, it)
		// Cached: no second request.
		again, err := p.DescribeInstanceType(ctx, "g4dn.xlarge")
		require.NoError(t, err)
		require.Equal(t, it, again)
		w.done(t)

		w.expect(fail("DescribeInstanceTypes", http.StatusBadRequest, "InvalidInstanceType", "The following supplied instance types do not exist: [x9.huge]"))
		_, err = p.DescribeInstanceType(ctx, "x9.huge")
		require.ErrorIs(t, err, provider.ErrUnknownInstanceType)
		w.done(t)
	})

	// Every EC2 call the package can make went over the wire.
	var seen []string
	for a := range w.seen {
		seen = append(seen, "ec2:"+a)
	}
	sort.Strings(seen)
	require.Equal(t, aws.IAMActions(), seen)
}
