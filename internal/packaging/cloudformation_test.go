package packaging_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"sigs.k8s.io/yaml"
)

// The CloudFormation example is checked without AWS: the template is read
// as plain YAML (it uses the long form of the intrinsic functions), every
// Ref, Fn::GetAtt, Fn::Sub variable and condition must resolve, and the
// template is evaluated with sample parameters to compare its embedded IAM
// policy and user data with the files in deploy/aws. cfn-lint (Python, not
// in the Debian/Go/npm registries CI reaches) runs too when it is
// installed.

const cfnRel = "deploy/aws/cloudformation/nstance-shard.yaml"

var cfnPseudo = []string{"AWS::AccountId", "AWS::NotificationARNs", "AWS::NoValue", "AWS::Partition", "AWS::Region", "AWS::StackId", "AWS::StackName", "AWS::URLSuffix"}

var cfnFunctions = []string{"Ref", "Fn::GetAtt", "Fn::Sub", "Fn::If", "Fn::Equals", "Fn::And", "Fn::Or", "Fn::Not",
	"Fn::Join", "Fn::Select", "Fn::Split", "Fn::Base64", "Fn::GetAZs", "Fn::ImportValue", "Fn::FindInMap", "Fn::Cidr", "Condition"}

var cfnSubVar = regexp.MustCompile(`\$\{([^}!][^}]*)\}`)

type cfnTemplate struct {
	raw        map[string]any
	params     map[string]map[string]any
	conditions map[string]any
	resources  map[string]map[string]any
}

func loadCFN(t *testing.T, data []byte) *cfnTemplate {
	t.Helper()
	var raw map[string]any
	require.NoError(t, yaml.Unmarshal(data, &raw))
	tm := &cfnTemplate{raw: raw, params: map[string]map[string]any{}, conditions: map[string]any{}, resources: map[string]map[string]any{}}
	for k, v := range asMap(raw["Parameters"]) {
		tm.params[k] = asMap(v)
	}
	tm.conditions = asMap(raw["Conditions"])
	for k, v := range asMap(raw["Resources"]) {
		tm.resources[k] = asMap(v)
	}
	return tm
}

func asMap(v any) map[string]any {
	m, _ := v.(map[string]any)
	return m
}

// check returns every structural or reference problem of the template.
func (tm *cfnTemplate) check() []error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	for k := range tm.raw {
		if !slices.Contains([]string{"AWSTemplateFormatVersion", "Description", "Metadata", "Parameters", "Rules", "Mappings", "Conditions", "Transform", "Resources", "Outputs"}, k) {
			bad("unknown top-level section %q", k)
		}
	}
	if tm.raw["AWSTemplateFormatVersion"] != "2010-09-09" {
		bad("AWSTemplateFormatVersion must be 2010-09-09")
	}
	if len(tm.resources) == 0 {
		bad("no Resources")
	}
	used := map[string]bool{}
	var walk func(where string, v any, inCondition bool)
	walk = func(where string, v any, inCondition bool) {
		switch x := v.(type) {
		case []any:
			for i, e := range x {
				walk(fmt.Sprintf("%s[%d]", where, i), e, inCondition)
			}
		case map[string]any:
			if len(x) == 1 {
				for fn, arg := range x {
					if strings.HasPrefix(fn, "Fn::") && !slices.Contains(cfnFunctions, fn) {
						bad("%s: unknown intrinsic function %s", where, fn)
					}
					switch fn {
					case "Ref":
						name, _ := arg.(string)
						used[name] = true
						if _, ok := tm.params[name]; !ok && tm.resources[name] == nil && !slices.Contains(cfnPseudo, name) {
							bad("%s: Ref %q is no parameter, resource or pseudo parameter", where, arg)
						}
						if inCondition && tm.resources[name] != nil {
							bad("%s: a condition cannot Ref resource %s", where, name)
						}
						return
					case "Fn::GetAtt":
						parts, _ := arg.([]any)
						if len(parts) != 2 {
							bad("%s: Fn::GetAtt takes [resource, attribute]", where)
							return
						}
						if name, _ := parts[0].(string); tm.resources[name] == nil {
							bad("%s: Fn::GetAtt of unknown resource %v", where, parts[0])
						}
						return
					case "Fn::Sub":
						var text string
						vars := map[string]any{}
						switch a := arg.(type) {
						case string:
							text = a
						case []any:
							if len(a) != 2 {
								bad("%s: Fn::Sub takes a string or [string, {vars}]", where)
								return
							}
							text, _ = a[0].(string)
							vars = asMap(a[1])
							walk(where+".Fn::Sub.vars", a[1], inCondition)
						}
						for _, m := range cfnSubVar.FindAllStringSubmatch(text, -1) {
							name := m[1]
							if _, ok := vars[name]; ok {
								continue
							}
							res, _, isAttr := strings.Cut(name, ".")
							switch {
							case isAttr && tm.resources[res] != nil:
							case !isAttr && (tm.params[name] != nil || tm.resources[name] != nil || slices.Contains(cfnPseudo, name)):
								used[name] = true
							default:
								bad("%s: Fn::Sub variable ${%s} resolves to nothing", where, name)
							}
						}
						return
					case "Fn::If":
						a, _ := arg.([]any)
						if len(a) != 3 {
							bad("%s: Fn::If takes [condition, then, else]", where)
							return
						}
						if _, ok := tm.conditions[fmt.Sprint(a[0])]; !ok {
							bad("%s: Fn::If on unknown condition %v", where, a[0])
						}
						walk(where+".then", a[1], inCondition)
						walk(where+".else", a[2], inCondition)
						return
					case "Condition":
						if s, ok := arg.(string); ok && inCondition {
							if _, ok := tm.conditions[s]; !ok {
								bad("%s: unknown condition %s", where, s)
							}
							return
						}
					}
				}
			}
			for k, e := range x {
				walk(where+"."+k, e, inCondition)
			}
		}
	}
	for name, c := range tm.conditions {
		walk("Conditions."+name, c, true)
	}
	for name, r := range tm.resources {
		typ, _ := r["Type"].(string)
		if !regexp.MustCompile(`^AWS::[A-Za-z0-9]+::[A-Za-z0-9]+$`).MatchString(typ) {
			bad("Resources.%s: Type %q", name, r["Type"])
		}
		for k := range r {
			if !slices.Contains([]string{"Type", "Properties", "Condition", "DependsOn", "DeletionPolicy", "UpdateReplacePolicy", "Metadata", "CreationPolicy", "UpdatePolicy"}, k) {
				bad("Resources.%s: unknown attribute %q", name, k)
			}
		}
		if c, ok := r["Condition"]; ok {
			if _, ok := tm.conditions[fmt.Sprint(c)]; !ok {
				bad("Resources.%s: unknown condition %v", name, c)
			}
		}
		deps := []any{r["DependsOn"]}
		if l, ok := r["DependsOn"].([]any); ok {
			deps = l
		}
		for _, d := range deps {
			if d != nil && tm.resources[fmt.Sprint(d)] == nil {
				bad("Resources.%s: DependsOn unknown resource %v", name, d)
			}
		}
		walk("Resources."+name+".Properties", r["Properties"], false)
	}
	walk("Outputs", tm.raw["Outputs"], false)
	for name := range tm.params {
		if !used[name] {
			bad("Parameters.%s is never used", name)
		}
	}
	return errs
}

// cfnEval evaluates the template's intrinsic functions with parameter
// values: Ref to a resource becomes "{{Ref:Name}}", Fn::GetAtt
// "{{GetAtt:Name.Attr}}".
type cfnEval struct {
	tm     *cfnTemplate
	params map[string]string
}

func (e *cfnEval) param(name string) (string, bool) {
	if v, ok := e.params[name]; ok {
		return v, true
	}
	p, ok := e.tm.params[name]
	if !ok {
		return "", false
	}
	if d, ok := p["Default"]; ok {
		return fmt.Sprint(d), true
	}
	return "", false
}

func (e *cfnEval) condition(t *testing.T, name string) bool {
	t.Helper()
	b, ok := e.eval(t, e.tm.conditions[name]).(bool)
	require.True(t, ok, "condition %s is not a boolean", name)
	return b
}

func (e *cfnEval) ref(t *testing.T, name string) any {
	t.Helper()
	if v, ok := e.param(name); ok {
		return v
	}
	if e.tm.resources[name] != nil {
		return "{{Ref:" + name + "}}"
	}
	if name == "AWS::Region" {
		return "us-west-2"
	}
	t.Fatalf("Ref %s: no value", name)
	return nil
}

func (e *cfnEval) eval(t *testing.T, v any) any {
	t.Helper()
	switch x := v.(type) {
	case []any:
		out := make([]any, len(x))
		for i, el := range x {
			out[i] = e.eval(t, el)
		}
		return out
	case map[string]any:
		if len(x) == 1 {
			for fn, arg := range x {
				switch fn {
				case "Ref":
					return e.ref(t, arg.(string))
				case "Fn::GetAtt":
					a := arg.([]any)
					return fmt.Sprintf("{{GetAtt:%v.%v}}", a[0], a[1])
				case "Fn::If":
					a := arg.([]any)
					if e.condition(t, a[0].(string)) {
						return e.eval(t, a[1])
					}
					return e.eval(t, a[2])
				case "Fn::Equals":
					a := arg.([]any)
					return fmt.Sprint(e.eval(t, a[0])) == fmt.Sprint(e.eval(t, a[1]))
				case "Fn::Base64":
					return e.eval(t, arg)
				case "Fn::Sub":
					text, vars := "", map[string]any{}
					if s, ok := arg.(string); ok {
						text = s
					} else {
						a := arg.([]any)
						text = a[0].(string)
						for k, v := range asMap(a[1]) {
							vars[k] = e.eval(t, v)
						}
					}
					text = cfnSubVar.ReplaceAllStringFunc(text, func(m string) string {
						name := m[2 : len(m)-1]
						if v, ok := vars[name]; ok {
							return fmt.Sprint(v)
						}
						if res, attr, ok := strings.Cut(name, "."); ok && e.tm.resources[res] != nil {
							return "{{GetAtt:" + res + "." + attr + "}}"
						}
						return fmt.Sprint(e.ref(t, name))
					})
					return strings.ReplaceAll(text, "${!", "${")
				}
			}
		}
		out := map[string]any{}
		for k, el := range x {
			out[k] = e.eval(t, el)
		}
		return out
	}
	return v
}

func readCFN(t *testing.T) (*cfnTemplate, []byte) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(root, cfnRel))
	require.NoError(t, err)
	return loadCFN(t, data), data
}

func TestCloudFormationReferences(t *testing.T) {
	tm, data := readCFN(t)
	require.Empty(t, tm.check(), "template problems")

	// The checker finds broken references (it can fail).
	for _, tc := range []struct{ from, to, want string }{
		{"VpcId: {Ref: VpcId}\n      AvailabilityZone", "VpcId: {Ref: VpcID}\n      AvailabilityZone", `Ref "VpcID"`},
		{"Fn::GetAtt: [ServerInstanceProfile, Arn]", "Fn::GetAtt: [ServerProfile, Arn]", "unknown resource ServerProfile"},
		{"nstance/${ClusterId}/encryption-key", "nstance/${Cluster}/encryption-key", "${Cluster} resolves to nothing"},
		{"Fn::If: [CreateShared, {Ref: StateBucket}, {Ref: SharedBucketName}]}\n  ServerRoleArn", "Fn::If: [Shared, {Ref: StateBucket}, {Ref: SharedBucketName}]}\n  ServerRoleArn", "unknown condition Shared"},
		{"DependsOn: [HealthListener]", "DependsOn: [Listener]", "DependsOn unknown resource Listener"},
		{"Fn::Sub: \"nstance-${ClusterId}-${ShardId}\"}}\n        - {Key: nstance.dev/cluster", "Fn::Subst: \"nstance-${ClusterId}-${ShardId}\"}}\n        - {Key: nstance.dev/cluster", "unknown intrinsic function Fn::Subst"},
	} {
		broken := strings.Replace(string(data), tc.from, tc.to, 1)
		require.NotEqual(t, string(data), broken, "fixture %q not found in the template", tc.from)
		require.ErrorContains(t, errors.Join(loadCFN(t, []byte(broken)).check()...), tc.want)
	}
}

func TestCloudFormationMatchesDeployFiles(t *testing.T) {
	tm, _ := readCFN(t)
	e := &cfnEval{tm: tm, params: map[string]string{
		"ClusterId": "prod", "ShardId": "us-west-2a", "StoragePrefix": "nstance/", "SharedBucketName": "example-nstance-state",
		"ReleaseUrl": "https://releases.example/v9", "BinarySha256Amd64": strings.Repeat("a", 64), "BinarySha256Arm64": strings.Repeat("b", 64),
		"KeySecretId": "nstance/prod/encryption-key", "VpcId": "vpc-1", "AvailabilityZone": "us-west-2a",
	}}
	require.False(t, e.condition(t, "CreateShared"), "a shared bucket is given: the stack must not create one")
	first := &cfnEval{tm: tm, params: map[string]string{"SharedBucketName": ""}}
	require.True(t, first.condition(t, "CreateShared"))

	// The server role's policy is deploy/aws/iam/nstance-server-policy.json.
	role := e.eval(t, tm.resources["ServerRole"]["Properties"]).(map[string]any)
	policies := role["Policies"].([]any)
	require.Len(t, policies, 1)
	got, err := json.Marshal(policies[0].(map[string]any)["PolicyDocument"])
	require.NoError(t, err)
	file, err := os.ReadFile(filepath.Join(root, "deploy", "aws", "iam", "nstance-server-policy.json"))
	require.NoError(t, err)
	want := strings.NewReplacer("@CLUSTER_ID@", "prod", "@SHARD_ID@", "us-west-2a", "@BUCKET@", "example-nstance-state",
		"@PREFIX@", "nstance/", "@AGENT_ROLE@", "{{Ref:AgentRole}}").Replace(string(file))
	require.JSONEq(t, want, string(got), "the template's server policy differs from deploy/aws/iam/nstance-server-policy.json")
	_, err = parseIAMPolicy(got)
	require.NoError(t, err)

	// The user data is the settings, then deploy/aws/user-data/nstance-server.sh.
	lt := e.eval(t, tm.resources["ServerLaunchTemplate"]["Properties"]).(map[string]any)
	data := lt["LaunchTemplateData"].(map[string]any)
	require.Equal(t, "required", data["MetadataOptions"].(map[string]any)["HttpTokens"], "IMDSv2 only")
	ud := data["UserData"].(string)
	require.True(t, strings.HasSuffix(ud, userDataBody(t)), "the template's user data does not end with %s", userDataRel)
	header := strings.Split(strings.TrimSuffix(strings.TrimSuffix(ud, userDataBody(t)), "\n"), "\n")
	require.Equal(t, "#!/bin/bash", header[0])
	settings := map[string]string{}
	for _, line := range header[1:] {
		m := regexp.MustCompile(`^export ([A-Z0-9_]+)='([^']*)'$`).FindStringSubmatch(line)
		require.NotNil(t, m, "user data line %q before the script is not a setting", line)
		settings[m[1]] = m[2]
	}
	require.Equal(t, map[string]string{
		"NSTANCE_SHARD": "us-west-2a", "NSTANCE_STORAGE_BUCKET": "example-nstance-state", "NSTANCE_STORAGE_PREFIX": "nstance/",
		"NSTANCE_LEADER_ENI": "{{Ref:LeaderInterface}}", "NSTANCE_LEADER_ADDRESS": "10.0.1.10",
		"NSTANCE_RELEASE_URL": "https://releases.example/v9", "NSTANCE_SHA256_AMD64": strings.Repeat("a", 64),
		"NSTANCE_SHA256_ARM64": strings.Repeat("b", 64), "NSTANCE_KEY_SECRET_ID": "nstance/prod/encryption-key", "AWS_REGION": "us-west-2",
	}, settings)
	// Every setting the script documents is one the template sets.
	for _, m := range regexp.MustCompile(`(?m)^#   ((?:NSTANCE|AWS)_[A-Z0-9_]+)`).FindAllStringSubmatch(userDataBody(t), -1) {
		if m[1] != "NSTANCE_INSTALL_ROOT" {
			require.Contains(t, settings, m[1])
		}
	}

	// The leader interface and the servers carry the tags the policy's
	// conditions name: the interface the shard's, the servers
	// nstance.dev/server-shard (never nstance.dev/shard).
	tags := func(res string) map[string]string {
		props := e.eval(t, tm.resources[res]["Properties"]).(map[string]any)
		out := map[string]string{}
		for _, tg := range props["Tags"].([]any) {
			m := tg.(map[string]any)
			out[m["Key"].(string)] = fmt.Sprint(m["Value"])
		}
		return out
	}
	eni := tags("LeaderInterface")
	require.Equal(t, "prod", eni["nstance.dev/cluster"])
	require.Equal(t, "us-west-2a", eni["nstance.dev/shard"])
	asgTags := tags("ServerGroup")
	require.Equal(t, "prod", asgTags["nstance.dev/cluster"])
	require.Equal(t, "us-west-2a", asgTags["nstance.dev/server-shard"])
	require.NotContains(t, asgTags, "nstance.dev/shard", "servers tagged as shard instances could terminate each other")

	// ASG of 1..N with an ELB health check on 8990.
	asg := e.eval(t, tm.resources["ServerGroup"]["Properties"]).(map[string]any)
	require.Equal(t, "ELB", asg["HealthCheckType"])
	require.Equal(t, []any{"{{Ref:Subnet}}"}, asg["VPCZoneIdentifier"])
	require.Equal(t, []any{"{{Ref:HealthTargetGroup}}"}, asg["TargetGroupARNs"])
	count := tm.params["ServerCount"]
	require.EqualValues(t, 1, count["MinValue"])
	require.Greater(t, count["MaxValue"], count["MinValue"])
	tg := e.eval(t, tm.resources["HealthTargetGroup"]["Properties"]).(map[string]any)
	require.Equal(t, "8990", tg["HealthCheckPort"])
	require.Contains(t, servedPaths(t), tg["HealthCheckPath"])
	listener := e.eval(t, tm.resources["HealthListener"]["Properties"]).(map[string]any)
	require.Equal(t, "{{Ref:HealthLoadBalancer}}", listener["LoadBalancerArn"], "a target group is health checked only behind a load balancer")
	ni := e.eval(t, tm.resources["LeaderInterface"]["Properties"]).(map[string]any)
	require.Equal(t, "{{Ref:Subnet}}", ni["SubnetId"])
	require.Equal(t, "10.0.1.10", ni["PrivateIpAddress"])
}

// TestCloudFormationLint runs cfn-lint, AWS's own template linter, when it is
// installed (pip install cfn-lint); CI cannot install it (no Python package
// index), so there only the checks above run.
func TestCloudFormationLint(t *testing.T) {
	lint, err := exec.LookPath("cfn-lint")
	if err != nil {
		t.Skip("cfn-lint is not installed (pip install cfn-lint); TestCloudFormationReferences and TestCloudFormationMatchesDeployFiles checked the template")
	}
	out, err := exec.Command(lint, filepath.Join(root, cfnRel)).CombinedOutput()
	require.NoError(t, err, "cfn-lint:\n%s", out)
	version, _ := exec.Command(lint, "--version").CombinedOutput()
	t.Logf("%s: no findings", strings.TrimSpace(string(version)))

	// And it catches what the Go check catches.
	data, err := os.ReadFile(filepath.Join(root, cfnRel))
	require.NoError(t, err)
	broken := filepath.Join(t.TempDir(), "broken.yaml")
	require.NoError(t, os.WriteFile(broken, []byte(strings.Replace(string(data), "SubnetId: {Ref: Subnet}", "SubnetId: {Ref: Subnett}", 1)), 0o644))
	out, err = exec.Command(lint, broken).CombinedOutput()
	require.Error(t, err)
	require.Contains(t, string(out), "Subnett")
	keys := []string{}
	for k := range loadCFN(t, data).resources {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	t.Logf("resources: %s", strings.Join(keys, ", "))
}
