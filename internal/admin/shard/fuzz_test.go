package shard

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/nstance-dev/nstance/internal/admin/adminserve"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// fakeOperator is a small in-memory Operator service: one group "g" and
// the calls the HTTP API makes. Other calls are not used by the API (the
// embedded nil interface would panic, which the fuzz target would report).
type fakeOperator struct {
	nstancev1.OperatorServiceClient
	group *nstancev1.GroupStatus
}

func newFakeOperator() *fakeOperator {
	return &fakeOperator{group: &nstancev1.GroupStatus{Spec: &nstancev1.GroupSpec{GroupId: "g", Template: "worker", Size: 2}, Etag: "e1"}}
}

func (f *fakeOperator) ListGroups(context.Context, *nstancev1.ListGroupsRequest, ...grpc.CallOption) (*nstancev1.ListGroupsResponse, error) {
	return &nstancev1.ListGroupsResponse{Groups: []*nstancev1.GroupStatus{proto.Clone(f.group).(*nstancev1.GroupStatus)}}, nil
}

func (f *fakeOperator) UpsertGroup(_ context.Context, r *nstancev1.UpsertGroupRequest, _ ...grpc.CallOption) (*nstancev1.UpsertGroupResponse, error) {
	if r.GetGroup().GetTemplate() == "" {
		return nil, status.Error(codes.InvalidArgument, "template is required")
	}
	if r.GetExpectedEtag() != "" && r.GetExpectedEtag() != f.group.GetEtag() {
		return nil, status.Error(codes.Aborted, "etag mismatch")
	}
	return &nstancev1.UpsertGroupResponse{Group: &nstancev1.GroupStatus{Spec: r.GetGroup(), Etag: "e2"}}, nil
}

func (f *fakeOperator) DeleteGroup(_ context.Context, r *nstancev1.DeleteGroupRequest, _ ...grpc.CallOption) (*nstancev1.DeleteGroupResponse, error) {
	if r.GetGroupId() != "g" {
		return nil, status.Error(codes.NotFound, "group not found")
	}
	return &nstancev1.DeleteGroupResponse{}, nil
}

func (f *fakeOperator) GetConfigStatus(context.Context, *nstancev1.GetConfigStatusRequest, ...grpc.CallOption) (*nstancev1.GetConfigStatusResponse, error) {
	return &nstancev1.GetConfigStatusResponse{}, nil
}

func (f *fakeOperator) RefreshConfig(context.Context, *nstancev1.RefreshConfigRequest, ...grpc.CallOption) (*nstancev1.RefreshConfigResponse, error) {
	return &nstancev1.RefreshConfigResponse{}, nil
}

const fuzzToken = "fuzz-token-0123456789-abcdefghijklmnop"

// fuzzRoutes are the API's routes a body can be sent to (and two it cannot).
var fuzzRoutes = []struct{ method, path string }{
	{"POST", "/v1/shards/dev-1/groups/g/scale"},
	{"PUT", "/v1/shards/dev-1/groups/g"},
	{"PUT", "/v1/shards/dev-1/groups/other"},
	{"POST", "/v1/shards/dev-1/groups/missing/scale"},
	{"POST", "/v1/shards/dev-1/config/refresh"},
	{"DELETE", "/v1/shards/dev-1/groups/g"},
	{"GET", "/v1/shards/dev-1/groups/g"},
	{"POST", "/v1/shards/dev-9/groups/g/scale"},
	{"PATCH", "/v1/shards/dev-1/groups/g"},
}

// FuzzServeBody sends arbitrary bodies, with arbitrary Content-Types, to the
// API behind serve's guard (valid token, own Host) over a small in-memory
// backend: it never panics and always answers 2xx or 4xx with JSON.
func FuzzServeBody(f *testing.F) {
	for i, body := range []string{
		`{"size":0}`, `{"size":3}`, `{"size":-1}`, `{"size":2147483649}`, `{"size":1.5}`, `{"size":"1"}`, `{"size":null}`,
		`{"size":1,"x":1}`, `{"size":1}}`, `{"size":1} {"size":2}`, `[]`, `null`, ``, `{`, "\xff\xfe",
		`{"template":"worker","size":2}`, `{"group_id":"g","template":"worker"}`, `{"group_id":"x","template":"w"}`,
		`{"template":"worker","vars":{"a":"b"},"size":4294967295}`, `{"template":"worker","size":4294967296}`,
		`{"template":"worker","unknown":1}`, `{"template":"\ud800"}`, strings.Repeat(`{"a":`, 1000),
	} {
		f.Add(uint8(i), "application/json", []byte(body))
	}
	f.Add(uint8(0), "text/plain", []byte(`{"size":0}`))
	f.Add(uint8(1), "application/json; charset=utf-16", []byte(`{"template":"worker"}`))
	f.Add(uint8(0), "", []byte(`{"size":0}`))
	f.Add(uint8(0), "application/json; charset=\"", []byte(`{"size":0}`))
	f.Fuzz(func(t *testing.T, route uint8, contentType string, body []byte) {
		op := newFakeOperator()
		set := &Set{names: []string{"dev-1"}, clients: map[string]nstancev1.OperatorServiceClient{"dev-1": op}}
		h, err := adminserve.Handler(adminserve.Options{Token: fuzzToken}, Handler(set))
		if err != nil {
			t.Fatal(err)
		}
		rt := fuzzRoutes[int(route)%len(fuzzRoutes)]
		r := httptest.NewRequest(rt.method, rt.path, bytes.NewReader(body))
		r.Host = "127.0.0.1:8980"
		r.Header.Set("Authorization", "Bearer "+fuzzToken)
		r.Header.Set("Content-Type", contentType)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code >= 500 || w.Code < 200 || (w.Code >= 300 && w.Code < 400) {
			t.Fatalf("%s %s (Content-Type %q, body %q): status %d: %s", rt.method, rt.path, contentType, body, w.Code, w.Body.String())
		}
		if ct := w.Header().Get("Content-Type"); ct != "application/json" {
			t.Fatalf("%s %s: Content-Type %q, want application/json: %s", rt.method, rt.path, ct, w.Body.String())
		}
		if !json.Valid(w.Body.Bytes()) {
			t.Fatalf("%s %s (body %q): the answer is not JSON: %q", rt.method, rt.path, body, w.Body.String())
		}
		if w.Code >= 400 {
			var e struct {
				Error string `json:"error"`
			}
			if err := json.Unmarshal(w.Body.Bytes(), &e); err != nil || e.Error == "" {
				t.Fatalf("%s %s: error answer %d without an error message: %s", rt.method, rt.path, w.Code, w.Body.String())
			}
		}
		// Only a valid body may change the group: scale sizes in range,
		// specs with a template.
		if w.Code == http.StatusOK && rt.method == "POST" && strings.HasSuffix(rt.path, "/g/scale") {
			var v struct {
				Size *int64 `json:"size"`
			}
			if json.Unmarshal(body, &v) != nil || v.Size == nil || *v.Size < 0 {
				t.Fatalf("scale accepted the body %q", body)
			}
		}
	})
}
