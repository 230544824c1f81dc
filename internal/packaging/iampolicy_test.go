package packaging_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"unicode"

	"github.com/stretchr/testify/require"
)

// The IAM JSON policy grammar (IAM User Guide, "Grammar of the IAM JSON
// policy language"), as far as identity-based policies use it.

// iamPlaceholders are the install-time values of deploy/aws/iam/*.json
// (docs/install-aws.md), with the sample values the tests substitute.
var iamPlaceholders = map[string]string{
	"@CLUSTER_ID@": "prod",
	"@SHARD_ID@":   "us-west-2a",
	"@BUCKET@":     "example-nstance-state",
	"@PREFIX@":     "nstance/",
	"@AGENT_ROLE@": "nstance-agent",
}

var (
	iamActionRE    = regexp.MustCompile(`^(\*|[a-z0-9-]+:[A-Za-z0-9*?]+)$`)
	iamARNRE       = regexp.MustCompile(`^arn:(aws|aws-cn|aws-us-gov):([a-z0-9-]+):([a-z0-9*-]*):([0-9]{12}|\*|):(\S+)$`)
	iamSidRE       = regexp.MustCompile(`^[A-Za-z0-9]+$`)
	iamCondKeyRE   = regexp.MustCompile(`^[a-z0-9-]+:[A-Za-z0-9_.:/*-]+$`)
	iamPlaceholder = regexp.MustCompile(`@[A-Z_]+@`)
)

// iamConditionOperators are the operators without the IfExists suffix or
// the ForAllValues:/ForAnyValue: set qualifiers.
var iamConditionOperators = []string{
	"StringEquals", "StringNotEquals", "StringEqualsIgnoreCase", "StringNotEqualsIgnoreCase", "StringLike", "StringNotLike",
	"NumericEquals", "NumericNotEquals", "NumericLessThan", "NumericLessThanEquals", "NumericGreaterThan", "NumericGreaterThanEquals",
	"DateEquals", "DateNotEquals", "DateLessThan", "DateLessThanEquals", "DateGreaterThan", "DateGreaterThanEquals",
	"Bool", "BinaryEquals", "IpAddress", "NotIpAddress", "ArnEquals", "ArnLike", "ArnNotEquals", "ArnNotLike", "Null",
}

// iamManagedPolicyMax is the size limit of a managed policy, whitespace not
// counted.
const iamManagedPolicyMax = 6144

type iamStatement struct {
	Sid                   string
	Effect                string
	Action, NotAction     []string
	Resource, NotResource []string
	Condition             map[string]map[string][]string
}

type iamPolicy struct {
	Statements []iamStatement
}

// stringOrList decodes a JSON string or a non-empty list of strings.
func stringOrList(raw json.RawMessage, what string) ([]string, error) {
	var one string
	if err := json.Unmarshal(raw, &one); err == nil {
		if one == "" {
			return nil, fmt.Errorf("%s is empty", what)
		}
		return []string{one}, nil
	}
	var many []string
	if err := json.Unmarshal(raw, &many); err != nil {
		return nil, fmt.Errorf("%s must be a string or a list of strings: %s", what, raw)
	}
	if len(many) == 0 {
		return nil, fmt.Errorf("%s is an empty list", what)
	}
	for _, s := range many {
		if s == "" {
			return nil, fmt.Errorf("%s has an empty entry", what)
		}
	}
	return many, nil
}

// checkDuplicateKeys walks the JSON tokens: encoding/json keeps the last of
// two equal keys silently, IAM rejects the document.
func checkDuplicateKeys(data []byte) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	type frame struct {
		object bool
		keys   map[string]bool
		expect bool // next string token in an object is a key
	}
	var stack []*frame
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("not JSON: %w", err)
		}
		var top *frame
		if len(stack) > 0 {
			top = stack[len(stack)-1]
		}
		if d, ok := tok.(json.Delim); ok {
			switch d {
			case '{', '[':
				if top != nil && top.object {
					top.expect = true // the value is consumed
				}
				stack = append(stack, &frame{object: d == '{', keys: map[string]bool{}, expect: d == '{'})
			case '}', ']':
				stack = stack[:len(stack)-1]
			}
			continue
		}
		if top != nil && top.object {
			if top.expect {
				k := tok.(string)
				if top.keys[k] {
					return fmt.Errorf("duplicate key %q", k)
				}
				top.keys[k] = true
				top.expect = false
			} else {
				top.expect = true
			}
		}
	}
}

// parseIAMPolicy checks data against the grammar and returns the statements,
// or every problem found.
func parseIAMPolicy(data []byte) (*iamPolicy, error) {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if err := checkDuplicateKeys(data); err != nil {
		return nil, err
	}
	compact := strings.Map(func(r rune) rune {
		if unicode.IsSpace(r) {
			return -1
		}
		return r
	}, string(data))
	if len(compact) > iamManagedPolicyMax {
		bad("policy is %d characters without whitespace, more than a managed policy's %d", len(compact), iamManagedPolicyMax)
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(data, &top); err != nil {
		return nil, fmt.Errorf("policy is not a JSON object: %w", err)
	}
	for k := range top {
		if !slices.Contains([]string{"Version", "Id", "Statement"}, k) {
			bad("unknown top-level element %q", k)
		}
	}
	var version string
	if err := json.Unmarshal(top["Version"], &version); err != nil || version != "2012-10-17" {
		bad("Version must be \"2012-10-17\" (policy variables and current grammar), got %s", top["Version"])
	}
	var raws []map[string]json.RawMessage
	if err := json.Unmarshal(top["Statement"], &raws); err != nil {
		var one map[string]json.RawMessage
		if err := json.Unmarshal(top["Statement"], &one); err != nil || one == nil {
			return nil, errors.Join(append(errs, fmt.Errorf("Statement must be an object or a list of objects"))...)
		}
		raws = []map[string]json.RawMessage{one}
	}
	if len(raws) == 0 {
		bad("Statement is empty")
	}
	p := &iamPolicy{}
	sids := map[string]bool{}
	for i, raw := range raws {
		st := iamStatement{}
		where := fmt.Sprintf("Statement[%d]", i)
		for k := range raw {
			switch k {
			case "Sid", "Effect", "Action", "NotAction", "Resource", "NotResource", "Condition":
			case "Principal", "NotPrincipal":
				bad("%s: %s belongs in resource-based policies, not an identity policy", where, k)
			default:
				bad("%s: unknown element %q", where, k)
			}
		}
		if s, ok := raw["Sid"]; ok {
			if err := json.Unmarshal(s, &st.Sid); err != nil || !iamSidRE.MatchString(st.Sid) {
				bad("%s: Sid must be alphanumeric: %s", where, s)
			} else if sids[st.Sid] {
				bad("%s: Sid %q is used twice", where, st.Sid)
			}
			sids[st.Sid] = true
			where += " (" + st.Sid + ")"
		}
		if err := json.Unmarshal(raw["Effect"], &st.Effect); err != nil || (st.Effect != "Allow" && st.Effect != "Deny") {
			bad("%s: Effect must be Allow or Deny, got %s", where, raw["Effect"])
		}
		pick := func(a, b string) (string, []string) {
			_, hasA := raw[a]
			_, hasB := raw[b]
			if hasA == hasB {
				bad("%s: exactly one of %s and %s is required", where, a, b)
				return "", nil
			}
			name := a
			if hasB {
				name = b
			}
			list, err := stringOrList(raw[name], where+" "+name)
			if err != nil {
				bad("%v", err)
			}
			return name, list
		}
		kind, actions := pick("Action", "NotAction")
		for _, a := range actions {
			if !iamActionRE.MatchString(a) {
				bad("%s: %s %q is not \"*\" or service:Action", where, kind, a)
			}
		}
		if kind == "Action" {
			st.Action = actions
		} else {
			st.NotAction = actions
		}
		kind, resources := pick("Resource", "NotResource")
		for _, r := range resources {
			if r == "*" {
				continue
			}
			m := iamARNRE.FindStringSubmatch(r)
			if m == nil {
				bad("%s: %s %q is not \"*\" or an ARN arn:partition:service:region:account:resource", where, kind, r)
				continue
			}
			if (m[2] == "s3" || m[2] == "iam") && (m[3] != "" || (m[2] == "s3" && m[4] != "")) {
				bad("%s: %s ARN %q: %s ARNs have no region%s", where, m[2], r, m[2], map[bool]string{true: " or account"}[m[2] == "s3"])
			}
			for _, a := range actions {
				if svc, _, ok := strings.Cut(a, ":"); ok && kind == "Resource" && svc != m[2] {
					bad("%s: action %s on a %s resource %q", where, a, m[2], r)
				}
			}
		}
		if kind == "Resource" {
			st.Resource = resources
		} else {
			st.NotResource = resources
		}
		if c, ok := raw["Condition"]; ok {
			var cond map[string]map[string]json.RawMessage
			if err := json.Unmarshal(c, &cond); err != nil || len(cond) == 0 {
				bad("%s: Condition must map operators to {key: value(s)}: %s", where, c)
			}
			st.Condition = map[string]map[string][]string{}
			for op, kv := range cond {
				if err := checkConditionOperator(op); err != nil {
					bad("%s: %v", where, err)
				}
				if len(kv) == 0 {
					bad("%s: condition %s has no keys", where, op)
				}
				st.Condition[op] = map[string][]string{}
				for key, v := range kv {
					if !iamCondKeyRE.MatchString(key) {
						bad("%s: condition key %q is not service:key", where, key)
					}
					vals, err := conditionValues(v)
					if err != nil {
						bad("%s: %s %s: %v", where, op, key, err)
					}
					if base := strings.TrimSuffix(op, "IfExists"); base == "Null" || base == "Bool" {
						for _, val := range vals {
							if val != "true" && val != "false" {
								bad("%s: %s %s: %q is not true or false", where, op, key, val)
							}
						}
					}
					st.Condition[op][key] = vals
				}
			}
		}
		p.Statements = append(p.Statements, st)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return p, nil
}

func checkConditionOperator(op string) error {
	base := op
	for _, q := range []string{"ForAllValues:", "ForAnyValue:"} {
		base = strings.TrimPrefix(base, q)
	}
	if strings.HasSuffix(base, "IfExists") && base != "NullIfExists" {
		base = strings.TrimSuffix(base, "IfExists")
	}
	if !slices.Contains(iamConditionOperators, base) {
		return fmt.Errorf("condition operator %q is not an IAM condition operator", op)
	}
	return nil
}

// conditionValues accepts a string, boolean or number, or a list of them.
func conditionValues(raw json.RawMessage) ([]string, error) {
	var list []json.RawMessage
	if err := json.Unmarshal(raw, &list); err != nil {
		list = []json.RawMessage{raw}
	}
	if len(list) == 0 {
		return nil, errors.New("empty value list")
	}
	var out []string
	for _, v := range list {
		var s string
		if err := json.Unmarshal(v, &s); err == nil {
			out = append(out, s)
			continue
		}
		var b bool
		if err := json.Unmarshal(v, &b); err == nil {
			out = append(out, fmt.Sprint(b))
			continue
		}
		var n json.Number
		if err := json.Unmarshal(v, &n); err == nil {
			out = append(out, n.String())
			continue
		}
		return nil, fmt.Errorf("value %s is not a string, boolean or number", v)
	}
	return out, nil
}

func iamGlob(pattern, s string) bool {
	re := "(?i)^" + strings.NewReplacer(`\*`, ".*", `\?`, ".").Replace(regexp.QuoteMeta(pattern)) + "$"
	return regexp.MustCompile(re).MatchString(s)
}

func (st iamStatement) matches(action string) bool {
	if st.Action != nil {
		return slices.ContainsFunc(st.Action, func(p string) bool { return iamGlob(p, action) })
	}
	return !slices.ContainsFunc(st.NotAction, func(p string) bool { return iamGlob(p, action) })
}

// allows reports whether some Allow statement grants action and no
// unconditional Deny on every resource takes it away.
func (p *iamPolicy) allows(action string) bool {
	allowed := false
	for _, st := range p.Statements {
		if !st.matches(action) {
			continue
		}
		if st.Effect == "Deny" && st.Condition == nil && slices.Equal(st.Resource, []string{"*"}) {
			return false
		}
		allowed = allowed || st.Effect == "Allow"
	}
	return allowed
}

// allowedActions lists the actions Allow statements name.
func (p *iamPolicy) allowedActions() []string {
	var out []string
	for _, st := range p.Statements {
		if st.Effect == "Allow" {
			out = append(out, st.Action...)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// substitutePlaceholders fills in the sample values and fails on a
// placeholder the docs do not name.
func substitutePlaceholders(t *testing.T, name string, data []byte) []byte {
	t.Helper()
	text := string(data)
	for k, v := range iamPlaceholders {
		text = strings.ReplaceAll(text, k, v)
	}
	require.Empty(t, iamPlaceholder.FindAllString(text, -1), "%s uses placeholders not listed in docs/install-aws.md", name)
	return []byte(text)
}

func loadPolicy(t *testing.T, name string) *iamPolicy {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(root, "deploy", "aws", "iam", name))
	require.NoError(t, err)
	p, err := parseIAMPolicy(substitutePlaceholders(t, name, data))
	require.NoError(t, err, "deploy/aws/iam/%s", name)
	return p
}

func TestIAMPolicyGrammar(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(root, "deploy", "aws", "iam", "*.json"))
	require.NoError(t, err)
	require.Len(t, files, 3)
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) { loadPolicy(t, filepath.Base(f)) })
	}

	// The install guide names every placeholder.
	doc, err := os.ReadFile(filepath.Join(root, "docs", "install-aws.md"))
	require.NoError(t, err)
	for k := range iamPlaceholders {
		require.Contains(t, string(doc), k, "docs/install-aws.md does not explain %s", k)
	}

	// The validator itself rejects what IAM rejects.
	for _, tc := range []struct{ name, doc, want string }{
		{"old version", `{"Version":"2008-10-17","Statement":[{"Effect":"Allow","Action":"s3:GetObject","Resource":"*"}]}`, "Version"},
		{"bad effect", `{"Version":"2012-10-17","Statement":[{"Effect":"Permit","Action":"s3:GetObject","Resource":"*"}]}`, "Effect"},
		{"action without service", `{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Action":"GetObject","Resource":"*"}]}`, "service:Action"},
		{"action and notaction", `{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Action":"s3:GetObject","NotAction":"s3:PutObject","Resource":"*"}]}`, "exactly one of Action"},
		{"no resource", `{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Action":"s3:GetObject"}]}`, "exactly one of Resource"},
		{"malformed arn", `{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Action":"s3:GetObject","Resource":"arn:aws:s3:bucket/x"}]}`, "not \"*\" or an ARN"},
		{"s3 arn with region", `{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Action":"s3:GetObject","Resource":"arn:aws:s3:us-east-1::b/*"}]}`, "no region"},
		{"action on another service's arn", `{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Action":"ec2:RunInstances","Resource":"arn:aws:s3:::b"}]}`, "on a s3 resource"},
		{"unknown operator", `{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Action":"s3:GetObject","Resource":"*","Condition":{"StringEqual":{"aws:ResourceTag/a":"b"}}}]}`, "not an IAM condition operator"},
		{"condition not a map", `{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Action":"s3:GetObject","Resource":"*","Condition":{"StringEquals":"b"}}]}`, "Condition must map"},
		{"null not boolean", `{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Action":"s3:GetObject","Resource":"*","Condition":{"Null":{"aws:TagKeys":"yes"}}}]}`, "not true or false"},
		{"principal", `{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Principal":"*","Action":"s3:GetObject","Resource":"*"}]}`, "resource-based"},
		{"duplicate key", `{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Action":"s3:GetObject","Action":"s3:PutObject","Resource":"*"}]}`, "duplicate key"},
		{"duplicate sid", `{"Version":"2012-10-17","Statement":[{"Sid":"A","Effect":"Allow","Action":"s3:GetObject","Resource":"*"},{"Sid":"A","Effect":"Allow","Action":"s3:PutObject","Resource":"*"}]}`, "used twice"},
		{"unknown element", `{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Actions":"s3:GetObject","Resource":"*"}]}`, "unknown element"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parseIAMPolicy([]byte(tc.doc))
			require.ErrorContains(t, err, tc.want)
		})
	}
	ok, err := parseIAMPolicy([]byte(`{"Version":"2012-10-17","Statement":{"Effect":"Allow","NotAction":"iam:*","Resource":"*",
		"Condition":{"ForAnyValue:StringLikeIfExists":{"aws:TagKeys":["a*"]},"Bool":{"aws:SecureTransport":true}}}}`))
	require.NoError(t, err)
	require.True(t, ok.allows("s3:GetObject"))
	require.False(t, ok.allows("iam:PassRole"))
}

// TestIAMServerPolicyScopesEC2 checks the shape of the server policy: every
// EC2 write is scoped by the ownership tags or to resources that a tagged
// launch only uses, and the storage grant ends at the bucket prefix.
func TestIAMServerPolicyScopesEC2(t *testing.T) {
	p := loadPolicy(t, "nstance-server-policy.json")
	usedByLaunch := regexp.MustCompile(`^arn:aws:ec2:\*:\*?:(volume|network-interface|spot-instances-request|subnet|security-group|key-pair|snapshot|image)/\*$`)
	for _, st := range p.Statements {
		if st.Effect != "Allow" {
			continue
		}
		for _, a := range st.Action {
			svc, op, _ := strings.Cut(a, ":")
			require.NotContains(t, a, "*", "%s: wildcard action %s", st.Sid, a)
			if svc != "ec2" || strings.HasPrefix(op, "Describe") {
				continue
			}
			scoped := false
			for _, kv := range st.Condition {
				for key := range kv {
					if strings.Contains(key, "/nstance.dev/") || key == "ec2:CreateAction" {
						scoped = true
					}
				}
			}
			if !scoped {
				require.Equal(t, []string{"ec2:RunInstances"}, st.Action, "%s: %s without a tag condition", st.Sid, a)
				for _, r := range st.Resource {
					require.Regexp(t, usedByLaunch, r, "%s: RunInstances on %s without a tag condition", st.Sid, r)
				}
			}
		}
		if slices.ContainsFunc(st.Action, func(a string) bool { return strings.HasPrefix(a, "s3:") }) {
			for _, r := range st.Resource {
				require.True(t, r == "arn:aws:s3:::example-nstance-state" || r == "arn:aws:s3:::example-nstance-state/nstance/*", "%s: S3 resource %s beyond the bucket prefix", st.Sid, r)
			}
		}
	}
	// The deny keeps a compromised server from re-tagging a foreign instance
	// into its shard.
	require.True(t, slices.ContainsFunc(p.Statements, func(st iamStatement) bool {
		return st.Effect == "Deny" && slices.Contains(st.Action, "ec2:CreateTags")
	}))
	require.False(t, p.allows("ec2:DeleteVolume"))
	require.False(t, p.allows("s3:DeleteBucket"))
}
