package shard

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/nstance-dev/nstance/internal/admin/adminserve"

	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// Handler serves the shard operations as JSON over HTTP:
//
//	GET    /v1/shards                                  shard names
//	GET    /v1/shards/{shard}/config                   GetConfigStatus
//	POST   /v1/shards/{shard}/config/refresh           RefreshConfig
//	GET    /v1/shards/{shard}/groups                   ListGroups
//	GET    /v1/shards/{shard}/groups/{group}           one group
//	PUT    /v1/shards/{shard}/groups/{group}           UpsertGroup (body: GroupSpec JSON)
//	POST   /v1/shards/{shard}/groups/{group}/scale     body {"size": N}
//	DELETE /v1/shards/{shard}/groups/{group}           DeleteGroup
//
// gRPC status codes map to HTTP statuses; errors are {"error": "..."}.
// Bodies must be application/json (415), at most 1 MiB (413), and are
// decoded strictly: unknown fields, trailing data and wrong types are 400.
// The handler does not authenticate: `nstance-admin serve` puts it behind
// adminserve.Handler.
func Handler(set *Set) http.Handler {
	mux := http.NewServeMux()
	h := &handler{set: set}
	mux.HandleFunc("GET /v1/shards", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]any{"shards": set.Names()})
	})
	mux.HandleFunc("GET /v1/shards/{shard}/config", h.configStatus)
	mux.HandleFunc("POST /v1/shards/{shard}/config/refresh", h.configRefresh)
	mux.HandleFunc("GET /v1/shards/{shard}/groups", h.listGroups)
	mux.HandleFunc("GET /v1/shards/{shard}/groups/{group}", h.getGroup)
	mux.HandleFunc("PUT /v1/shards/{shard}/groups/{group}", h.putGroup)
	mux.HandleFunc("POST /v1/shards/{shard}/groups/{group}/scale", h.scaleGroup)
	mux.HandleFunc("DELETE /v1/shards/{shard}/groups/{group}", h.deleteGroup)
	return adminserve.JSONErrors(mux)
}

type handler struct{ set *Set }

const maxBody = 1 << 20

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

func writeProto(w http.ResponseWriter, m proto.Message) {
	b, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(m)
	if err != nil {
		writeErr(w, err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(append(b, '\n'))
}

func writeErr(w http.ResponseWriter, err error) {
	code := http.StatusBadGateway
	switch status.Code(err) {
	case codes.InvalidArgument:
		code = http.StatusBadRequest
	case codes.NotFound:
		code = http.StatusNotFound
	case codes.Aborted, codes.FailedPrecondition, codes.AlreadyExists:
		code = http.StatusConflict
	case codes.Unauthenticated:
		code = http.StatusUnauthorized
	case codes.PermissionDenied:
		code = http.StatusForbidden
	case codes.Unavailable, codes.DeadlineExceeded:
		code = http.StatusServiceUnavailable
	}
	var he httpError
	if errors.As(err, &he) {
		code = he.code
	}
	writeJSON(w, code, map[string]string{"error": err.Error()})
}

type httpError struct {
	code int
	msg  string
}

func (e httpError) Error() string { return e.msg }

// readJSONBody reads the whole body of a request that must carry JSON: an
// other Content-Type is 415, over maxBody bytes 413.
func readJSONBody(w http.ResponseWriter, r *http.Request) ([]byte, bool) {
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/json" {
		writeErr(w, httpError{http.StatusUnsupportedMediaType, fmt.Sprintf("Content-Type %q: the body must be application/json", r.Header.Get("Content-Type"))})
		return nil, false
	}
	b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	var tooLarge *http.MaxBytesError
	switch {
	case errors.As(err, &tooLarge):
		writeErr(w, httpError{http.StatusRequestEntityTooLarge, fmt.Sprintf("body over %d bytes", tooLarge.Limit)})
		return nil, false
	case err != nil:
		writeErr(w, httpError{http.StatusBadRequest, "reading the body: " + err.Error()})
		return nil, false
	}
	return b, true
}

func (h *handler) client(w http.ResponseWriter, r *http.Request) (nstancev1.OperatorServiceClient, bool) {
	c, err := h.set.Client(r.PathValue("shard"))
	if err != nil {
		writeErr(w, httpError{http.StatusNotFound, err.Error()})
		return nil, false
	}
	return c, true
}

func (h *handler) configStatus(w http.ResponseWriter, r *http.Request) {
	if c, ok := h.client(w, r); ok {
		resp, err := c.GetConfigStatus(r.Context(), &nstancev1.GetConfigStatusRequest{})
		if err != nil {
			writeErr(w, err)
			return
		}
		writeProto(w, resp)
	}
}

func (h *handler) configRefresh(w http.ResponseWriter, r *http.Request) {
	if c, ok := h.client(w, r); ok {
		resp, err := c.RefreshConfig(r.Context(), &nstancev1.RefreshConfigRequest{})
		if err != nil {
			writeErr(w, err)
			return
		}
		writeProto(w, resp)
	}
}

func (h *handler) listGroups(w http.ResponseWriter, r *http.Request) {
	if c, ok := h.client(w, r); ok {
		resp, err := c.ListGroups(r.Context(), &nstancev1.ListGroupsRequest{})
		if err != nil {
			writeErr(w, err)
			return
		}
		writeProto(w, resp)
	}
}

func (h *handler) getGroup(w http.ResponseWriter, r *http.Request) {
	if c, ok := h.client(w, r); ok {
		g, err := FindGroup(r.Context(), c, r.PathValue("group"))
		if err != nil {
			writeErr(w, err)
			return
		}
		if g == nil {
			writeErr(w, httpError{http.StatusNotFound, "group " + r.PathValue("group") + " not found"})
			return
		}
		writeProto(w, g)
	}
}

func (h *handler) putGroup(w http.ResponseWriter, r *http.Request) {
	c, ok := h.client(w, r)
	if !ok {
		return
	}
	body, ok := readJSONBody(w, r)
	if !ok {
		return
	}
	var spec nstancev1.GroupSpec
	if err := protojson.Unmarshal(body, &spec); err != nil {
		writeErr(w, httpError{http.StatusBadRequest, "body is not a GroupSpec: " + err.Error()})
		return
	}
	if spec.GroupId != "" && spec.GroupId != r.PathValue("group") {
		writeErr(w, httpError{http.StatusBadRequest, "group_id in the body differs from the path"})
		return
	}
	spec.GroupId = r.PathValue("group")
	resp, err := c.UpsertGroup(r.Context(), &nstancev1.UpsertGroupRequest{Group: &spec, ExpectedEtag: strings.Trim(r.Header.Get("If-Match"), `"`)})
	if err != nil {
		writeErr(w, err)
		return
	}
	writeProto(w, resp)
}

func (h *handler) scaleGroup(w http.ResponseWriter, r *http.Request) {
	c, ok := h.client(w, r)
	if !ok {
		return
	}
	raw, ok := readJSONBody(w, r)
	if !ok {
		return
	}
	const want = `body must be {"size": N} with 0 <= N <= 2147483648`
	var body struct {
		Size *int64 `json:"size"`
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&body); err != nil {
		writeErr(w, httpError{http.StatusBadRequest, want + ": " + err.Error()})
		return
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		writeErr(w, httpError{http.StatusBadRequest, want + ": data after the JSON object"})
		return
	}
	if body.Size == nil || *body.Size < 0 || *body.Size > 1<<31 {
		writeErr(w, httpError{http.StatusBadRequest, want + ": size is missing or out of range"})
		return
	}
	g, err := Scale(r.Context(), c, r.PathValue("group"), uint32(*body.Size))
	if err != nil {
		if status.Code(err) == codes.Unknown {
			writeErr(w, httpError{http.StatusNotFound, err.Error()})
			return
		}
		writeErr(w, err)
		return
	}
	writeProto(w, g)
}

func (h *handler) deleteGroup(w http.ResponseWriter, r *http.Request) {
	if c, ok := h.client(w, r); ok {
		resp, err := c.DeleteGroup(r.Context(), &nstancev1.DeleteGroupRequest{GroupId: r.PathValue("group"), ExpectedEtag: strings.Trim(r.Header.Get("If-Match"), `"`)})
		if err != nil {
			writeErr(w, err)
			return
		}
		writeProto(w, resp)
	}
}
