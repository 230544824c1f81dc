package fake

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"sync"

	"cloud.google.com/go/compute/apiv1/computepb"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/nstance-dev/nstance/internal/server/provider/gcp"
)

// REST serves the fake over Compute Engine's REST API (the JSON of the
// v1 reference, zone operations that are done at once, googleapi error
// bodies), so the real client library can be tested against it through
// httptest. It records which REST methods were called and checks what
// every request must carry; Problems lists what was wrong.
type REST struct {
	F *Compute

	mu       sync.Mutex
	seen     map[string]int
	problems []string
	ops      int
}

// NewREST returns the REST front of f.
func NewREST(f *Compute) *REST { return &REST{F: f, seen: map[string]int{}} }

// Seen returns how often each REST method ("instances.insert", …,
// "zoneOperations.get") was called.
func (s *REST) Seen() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]int{}
	for k, v := range s.seen {
		out[k] = v
	}
	return out
}

// Problems returns what requests got wrong (missing routing headers, a
// body that is not the resource's JSON, an unknown route).
func (s *REST) Problems() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.problems...)
}

func (s *REST) problem(format string, args ...any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.problems = append(s.problems, fmt.Sprintf(format, args...))
}

type route struct {
	method, verb string
	re           *regexp.Regexp
}

const pz = `^/compute/v1/projects/([^/]+)/zones/([^/]+)/`

var routes = []route{
	{"instances.insert", http.MethodPost, regexp.MustCompile(pz + `instances$`)},
	{"instances.list", http.MethodGet, regexp.MustCompile(pz + `instances$`)},
	{"instances.get", http.MethodGet, regexp.MustCompile(pz + `instances/([^/]+)$`)},
	{"instances.delete", http.MethodDelete, regexp.MustCompile(pz + `instances/([^/]+)$`)},
	{"instances.updateNetworkInterface", http.MethodPatch, regexp.MustCompile(pz + `instances/([^/]+)/updateNetworkInterface$`)},
	{"addresses.get", http.MethodGet, regexp.MustCompile(`^/compute/v1/projects/([^/]+)/regions/([^/]+)/addresses/([^/]+)$`)},
	{"instanceGroups.addInstances", http.MethodPost, regexp.MustCompile(pz + `instanceGroups/([^/]+)/addInstances$`)},
	{"instanceGroups.removeInstances", http.MethodPost, regexp.MustCompile(pz + `instanceGroups/([^/]+)/removeInstances$`)},
	{"instanceGroups.listInstances", http.MethodPost, regexp.MustCompile(pz + `instanceGroups/([^/]+)/listInstances$`)},
	{"zoneOperations.get", http.MethodGet, regexp.MustCompile(pz + `operations/([^/]+)$`)},
}

func writeError(w http.ResponseWriter, err error) {
	code := gcp.HTTPCode(err)
	if code == 0 {
		code = http.StatusInternalServerError
	}
	w.Header().Set("Content-Type", "application/json; charset=UTF-8")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]any{"code": code, "message": err.Error(),
		"errors": []map[string]string{{"message": err.Error(), "domain": "global", "reason": http.StatusText(code)}}}})
}

func writeJSON(w http.ResponseWriter, m proto.Message) {
	b, err := protojson.Marshal(m)
	if err != nil {
		writeError(w, err)
		return
	}
	w.Header().Set("Content-Type", "application/json; charset=UTF-8")
	_, _ = w.Write(b)
}

// op answers a mutation with a zone operation that is already done.
func (s *REST) op(w http.ResponseWriter, project, zone, kind string, err error) {
	if err != nil {
		writeError(w, err)
		return
	}
	s.mu.Lock()
	s.ops++
	n := s.ops
	s.mu.Unlock()
	writeJSON(w, &computepb.Operation{Name: proto.String("operation-" + strconv.Itoa(n)), OperationType: proto.String(kind),
		Status: computepb.Operation_DONE.Enum(), Zone: proto.String(zone),
		SelfLink: proto.String(fmt.Sprintf("https://www.googleapis.com/compute/v1/projects/%s/zones/%s/operations/operation-%d", project, zone, n))})
}

// ServeHTTP implements http.Handler.
func (s *REST) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var rt *route
	var m []string
	for i := range routes {
		if routes[i].verb == r.Method {
			if m = routes[i].re.FindStringSubmatch(r.URL.Path); m != nil {
				rt = &routes[i]
				break
			}
		}
	}
	if rt == nil {
		s.problem("no route for %s %s", r.Method, r.URL.Path)
		http.NotFound(w, r)
		return
	}
	s.mu.Lock()
	s.seen[rt.method]++
	s.mu.Unlock()
	// The client sends routing parameters on every call but the lists.
	if r.Header.Get("x-goog-request-params") == "" && rt.method != "instances.list" && rt.method != "instanceGroups.listInstances" {
		s.problem("%s: no x-goog-request-params header", rt.method)
	}
	if c := r.Header.Get("x-goog-api-client"); !regexp.MustCompile(`\brest/`).MatchString(c) {
		s.problem("%s: x-goog-api-client %q does not name the REST transport", rt.method, c)
	}
	if a := r.Header.Get("Authorization"); a != "" {
		s.problem("%s: Authorization %q sent without credentials", rt.method, a)
	}
	body, _ := io.ReadAll(r.Body)
	decode := func(msg proto.Message) bool {
		if err := protojson.Unmarshal(body, msg); err != nil {
			s.problem("%s: body is not the resource's JSON: %v (%s)", rt.method, err, body)
			writeError(w, gcp.NewError(http.StatusBadRequest, err.Error()))
			return false
		}
		return true
	}
	ctx := context.Background()
	project, q := m[1], r.URL.Query()
	switch rt.method {
	case "instances.insert":
		inst := &computepb.Instance{}
		if !decode(inst) {
			return
		}
		req := &computepb.InsertInstanceRequest{Project: project, Zone: m[2], InstanceResource: inst}
		if t := q.Get("sourceInstanceTemplate"); t != "" {
			req.SourceInstanceTemplate = proto.String(t)
		}
		s.op(w, project, m[2], "insert", s.F.InsertInstance(ctx, req))
	case "instances.list":
		req := &computepb.ListInstancesRequest{Project: project, Zone: m[2]}
		if f := q.Get("filter"); f != "" {
			req.Filter = proto.String(f)
		}
		out, err := s.F.ListInstances(ctx, req)
		if err != nil {
			writeError(w, err)
			return
		}
		writeJSON(w, &computepb.InstanceList{Items: out})
	case "instances.get":
		out, err := s.F.GetInstance(ctx, &computepb.GetInstanceRequest{Project: project, Zone: m[2], Instance: m[3]})
		if err != nil {
			writeError(w, err)
			return
		}
		writeJSON(w, out)
	case "instances.delete":
		s.op(w, project, m[2], "delete", s.F.DeleteInstance(ctx, &computepb.DeleteInstanceRequest{Project: project, Zone: m[2], Instance: m[3]}))
	case "instances.updateNetworkInterface":
		ni := &computepb.NetworkInterface{}
		if !decode(ni) {
			return
		}
		s.op(w, project, m[2], "updateNetworkInterface", s.F.UpdateNetworkInterface(ctx, &computepb.UpdateNetworkInterfaceInstanceRequest{
			Project: project, Zone: m[2], Instance: m[3], NetworkInterface: q.Get("networkInterface"), NetworkInterfaceResource: ni}))
	case "addresses.get":
		out, err := s.F.GetAddress(ctx, &computepb.GetAddressRequest{Project: project, Region: m[2], Address: m[3]})
		if err != nil {
			writeError(w, err)
			return
		}
		writeJSON(w, out)
	case "instanceGroups.addInstances":
		res := &computepb.InstanceGroupsAddInstancesRequest{}
		if !decode(res) {
			return
		}
		s.op(w, project, m[2], "addInstances", s.F.AddInstances(ctx, &computepb.AddInstancesInstanceGroupRequest{Project: project, Zone: m[2],
			InstanceGroup: m[3], InstanceGroupsAddInstancesRequestResource: res}))
	case "instanceGroups.removeInstances":
		res := &computepb.InstanceGroupsRemoveInstancesRequest{}
		if !decode(res) {
			return
		}
		s.op(w, project, m[2], "removeInstances", s.F.RemoveInstances(ctx, &computepb.RemoveInstancesInstanceGroupRequest{Project: project, Zone: m[2],
			InstanceGroup: m[3], InstanceGroupsRemoveInstancesRequestResource: res}))
	case "instanceGroups.listInstances":
		out, err := s.F.ListGroupInstances(ctx, &computepb.ListInstancesInstanceGroupsRequest{Project: project, Zone: m[2], InstanceGroup: m[3]})
		if err != nil {
			writeError(w, err)
			return
		}
		writeJSON(w, &computepb.InstanceGroupsListInstances{Items: out})
	case "zoneOperations.get":
		writeJSON(w, &computepb.Operation{Name: proto.String(m[3]), Status: computepb.Operation_DONE.Enum(), Zone: proto.String(m[2])})
	}
}
