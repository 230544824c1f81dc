package packaging_test

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// The AWS calls a program makes, derived from its source: every operation of
// an aws-sdk-go-v2 service client appears in the code as its input type
// `<svc>.<Op>Input` (a composite literal `&ec2.RunInstancesInput{...}`, a
// `new(...)`, a variable, or a parameter of a method of an interface such as
// `EC2API`), and every paginator as `<svc>.New<Op>Paginator`. The scanner
// resolves the qualifier through the file's imports, so a renamed import is
// found and a local package that happens to be called `ec2` is not.

const sdkServicePrefix = "github.com/aws/aws-sdk-go-v2/service/"

// iamServicePrefix maps an SDK service package name to the IAM service
// prefix where they differ.
var iamServicePrefix = map[string]string{
	"elasticloadbalancingv2": "elasticloadbalancing",
}

// iamActionsFor maps operations whose IAM permission differs from the
// operation name (service authorization reference, "Actions defined by ...").
var iamActionsFor = map[string][]string{
	"s3:HeadObject":              {"s3:GetObject"},
	"s3:ListObjectsV2":           {"s3:ListBucket"},
	"s3:ListObjects":             {"s3:ListBucket"},
	"s3:HeadBucket":              {"s3:ListBucket"},
	"s3:DeleteObjects":           {"s3:DeleteObject"},
	"s3:CopyObject":              {"s3:GetObject", "s3:PutObject"},
	"s3:CreateMultipartUpload":   {"s3:PutObject"},
	"s3:UploadPart":              {"s3:PutObject"},
	"s3:CompleteMultipartUpload": {"s3:PutObject"},
	"s3:ListParts":               {"s3:ListMultipartUploadParts"},
	"s3:ListMultipartUploads":    {"s3:ListBucketMultipartUploads"},
}

// awsCall is one operation found in the source, with where it was seen.
type awsCall struct {
	Op    string // "<svc>:<Operation>" with the SDK's service package name
	Where string // file:line
}

// scanAWSCalls parses files (paths) and returns the operations they use.
func scanAWSCalls(files []string) ([]awsCall, error) {
	fset := token.NewFileSet()
	var calls []awsCall
	for _, path := range files {
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return nil, fmt.Errorf("parse %s: %w", path, err)
		}
		// Local name -> SDK service package name.
		services := map[string]string{}
		for _, imp := range f.Imports {
			p, err := strconv.Unquote(imp.Path.Value)
			if err != nil {
				return nil, fmt.Errorf("%s: import %s: %w", path, imp.Path.Value, err)
			}
			svc, ok := strings.CutPrefix(p, sdkServicePrefix)
			if !ok || strings.Contains(svc, "/") {
				continue // not a service client package (types, internal, feature/...)
			}
			local := svc
			if imp.Name != nil {
				local = imp.Name.Name
			}
			if local == "_" || local == "." {
				continue
			}
			services[local] = svc
		}
		if len(services) == 0 {
			continue
		}
		ast.Inspect(f, func(n ast.Node) bool {
			sel, ok := n.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			id, ok := sel.X.(*ast.Ident)
			if !ok {
				return true
			}
			svc, ok := services[id.Name]
			if !ok {
				return true
			}
			name := sel.Sel.Name
			op := ""
			switch {
			case strings.HasSuffix(name, "Input") && len(name) > len("Input"):
				op = strings.TrimSuffix(name, "Input")
			case strings.HasPrefix(name, "New") && strings.HasSuffix(name, "Paginator"):
				op = strings.TrimSuffix(strings.TrimPrefix(name, "New"), "Paginator")
			}
			if op != "" {
				pos := fset.Position(sel.Pos())
				calls = append(calls, awsCall{Op: svc + ":" + op, Where: fmt.Sprintf("%s:%d", pos.Filename, pos.Line)})
			}
			return true
		})
	}
	return calls, nil
}

// iamActions turns an SDK operation into the IAM actions it needs.
func iamActions(op string) []string {
	if acts, ok := iamActionsFor[op]; ok {
		return acts
	}
	svc, name, _ := strings.Cut(op, ":")
	if p, ok := iamServicePrefix[svc]; ok {
		svc = p
	}
	return []string{svc + ":" + name}
}

// moduleFiles lists the non-test Go files of this module's packages that
// the given main package links.
func moduleFiles(t *testing.T, pkg string) []string {
	t.Helper()
	out := run(t, root, "go", "list", "-deps", "-f", `{{.ImportPath}}|{{.Dir}}|{{join .GoFiles ","}}`, pkg)
	var files []string
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		parts := strings.SplitN(line, "|", 3)
		require.Len(t, parts, 3, "go list line %q", line)
		if parts[0] != "github.com/nstance-dev/nstance" && !strings.HasPrefix(parts[0], "github.com/nstance-dev/nstance/") {
			continue
		}
		for _, f := range strings.Split(parts[2], ",") {
			if f != "" {
				files = append(files, filepath.Join(parts[1], f))
			}
		}
	}
	require.NotEmpty(t, files, "no module files linked by %s", pkg)
	return files
}

// treeFiles lists the non-test Go files under dir (relative to the repo).
func treeFiles(t *testing.T, dir string) []string {
	t.Helper()
	out := run(t, root, "go", "list", "-f", `{{.Dir}}|{{join .GoFiles ","}}`, "./"+dir+"/...")
	var files []string
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		d, names, _ := strings.Cut(line, "|")
		for _, f := range strings.Split(names, ",") {
			if f != "" {
				files = append(files, filepath.Join(d, f))
			}
		}
	}
	return files
}

func TestAWSCallScannerFixture(t *testing.T) {
	calls, err := scanAWSCalls([]string{
		filepath.Join("testdata", "awsactions", "fixture.go"),
		filepath.Join("testdata", "awsactions", "local.go"),
	})
	require.NoError(t, err)
	var ops []string
	for _, c := range calls {
		ops = append(ops, c.Op)
		require.Regexp(t, `fixture\.go:\d+$`, c.Where)
	}
	slices.Sort(ops)
	ops = slices.Compact(ops)
	require.Equal(t, []string{
		"ec2:AttachNetworkInterface", // interface EC2API method parameter
		"ec2:DescribeInstances",      // paginator and its input
		"ec2:DetachNetworkInterface", // new(...)
		"ec2:RunInstances",           // &ec2.RunInstancesInput{...}
		"ec2:TerminateInstances",     // var in ec2.TerminateInstancesInput
		"s3:ListObjectsV2",           // paginator only
		"s3:PutObject",               // renamed import
		"secretsmanager:GetSecretValue",
		"ssm:GetParameter",
	}, ops, "ec2types.InstanceType, a local package named ec2 and the Output types must not count")

	require.Equal(t, []string{"s3:ListBucket"}, iamActions("s3:ListObjectsV2"))
	require.Equal(t, []string{"ec2:RunInstances"}, iamActions("ec2:RunInstances"))

	// A file that does not parse is an error, not an empty result.
	_, err = scanAWSCalls([]string{filepath.Join("testdata", "awsactions", "broken.go.txt")})
	require.Error(t, err)
}

// TestIAMPoliciesCoverAWSCalls fails when a binary calls an AWS operation its
// policy in deploy/aws/iam does not allow.
func TestIAMPoliciesCoverAWSCalls(t *testing.T) {
	server := loadPolicy(t, "nstance-server-policy.json")
	operator := loadPolicy(t, "nstance-operator-policy.json")

	// The server: what nstance-server links, plus every package under
	// internal/server (a provider is covered even before it is registered).
	files := append(moduleFiles(t, "./cmd/nstance-server"), treeFiles(t, "internal/server")...)
	slices.Sort(files)
	files = slices.Compact(files)
	calls, err := scanAWSCalls(files)
	require.NoError(t, err)
	require.NotEmpty(t, calls, "the server's S3 storage calls were not found: the scanner is broken")
	granted := map[string]bool{}
	var missing []string
	for _, c := range calls {
		for _, action := range iamActions(c.Op) {
			granted[action] = true
			if !server.allows(action) {
				missing = append(missing, fmt.Sprintf("%s (%s at %s)", action, c.Op, c.Where))
			}
		}
	}
	slices.Sort(missing)
	require.Empty(t, slices.Compact(missing), "deploy/aws/iam/nstance-server-policy.json does not allow what the server calls")
	var used []string
	for a := range granted {
		used = append(used, a)
	}
	sort.Strings(used)
	t.Logf("server calls need: %s", strings.Join(used, ", "))
	for _, a := range server.allowedActions() {
		if !granted[a] {
			t.Logf("granted, not called by code in this tree (yet): %s", a)
		}
	}

	// The operator talks to shard servers (gRPC) and Kubernetes only: its
	// policy grants nothing, so it must link no AWS operation.
	calls, err = scanAWSCalls(moduleFiles(t, "./cmd/nstance-operator"))
	require.NoError(t, err)
	for _, c := range calls {
		for _, action := range iamActions(c.Op) {
			require.True(t, operator.allows(action), "the operator calls %s (%s) but deploy/aws/iam/nstance-operator-policy.json grants nothing", action, c.Where)
		}
	}
	require.False(t, operator.allows("s3:GetObject"))

	// nstance-admin's storage commands (cluster nonce, register-operator,
	// rotate-ca, rotate-encryption-key) open the bucket directly.
	admin := loadPolicy(t, "nstance-admin-policy.json")
	calls, err = scanAWSCalls(moduleFiles(t, "./cmd/nstance-admin"))
	require.NoError(t, err)
	require.NotEmpty(t, calls, "nstance-admin links the S3 store; the scanner found no call")
	for _, c := range calls {
		for _, action := range iamActions(c.Op) {
			require.True(t, admin.allows(action), "nstance-admin calls %s (%s) but deploy/aws/iam/nstance-admin-policy.json does not allow it", action, c.Where)
		}
	}

	// The agent runs with an instance profile without policies: it reads
	// only the instance metadata service, which IAM does not govern.
	calls, err = scanAWSCalls(moduleFiles(t, "./cmd/nstance-agent"))
	require.NoError(t, err)
	require.Empty(t, calls, "nstance-agent calls AWS APIs; docs/install-aws.md says its instance profile needs no policy")
}
