package apiserver

import (
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// Hand-edited custom resource files pass the same schema as API writes:
// pruned and defaulted in the version the file names, then validated
// against the previous object (so CEL transition rules such as immutability
// hold) or as a new object. A file that fails keeps the last valid object
// served; the store logs the error with the path, and a Warning Event on
// the object names the file and the fields. A hand-edited built-in object
// must fit its Go type (a ConfigMap's data values are strings) and pass the
// validation API writes get; it is then served as written.

const invalidFileReason = "InvalidFile"

// admitFileObject is the store's Admit hook (called with the store locked).
func (s *Server) admitFileObject(storage, path string, old, obj map[string]any) error {
	res, ok := s.reg.ByStorageName(storage)
	if !ok || (res.Schema == nil && !res.BuiltIn) {
		return nil
	}
	err := func() error {
		if res.Schema == nil {
			// A copy goes through the Go type: the file is served as written.
			typed, err := s.roundTrip(res, runtime.DeepCopyJSON(obj))
			if err != nil {
				return err
			}
			return s.validate(res, old, typed)
		}
		v := res.Schema.ForObject(obj)
		if _, err := v.Decode(obj, false); err != nil {
			return crDecodeError(res, err)
		}
		var prev map[string]any
		if old != nil {
			var err error
			if prev, err = v.Read(old); err != nil {
				return err
			}
			// The store gives the file its new resourceVersion afterwards.
			metaOf(obj)["resourceVersion"] = str(metaOf(prev), "resourceVersion")
			// Generation as the strategy counts it: any change but metadata
			// (and status, when it has its own subresource).
			gen := generationOf(metaOf(prev))
			if fileChanged(prev, obj, v.HasStatus()) {
				gen++
			}
			metaOf(obj)["generation"] = gen
		}
		if errs := v.ValidateFile(s.ctx, obj, prev); len(errs) > 0 {
			return apierrors.NewInvalid(v.GroupKind(), str(metaOf(obj), "name"), errs)
		}
		return v.Store(obj)
	}()
	if err != nil {
		err = fmt.Errorf("hand-edited file %s: %w", path, err)
		s.recordFileEvent(res.Namespaced, obj, old, err)
	}
	return err
}

// recordFileEvent records a Warning Event about a refused file. It runs
// after the store lock is released (the Event is itself stored).
func (s *Server) recordFileEvent(namespaced bool, obj, old map[string]any, cause error) {
	md := metaOf(obj)
	ns := "default"
	if namespaced {
		ns = str(md, "namespace")
	}
	uid := str(md, "uid")
	if old != nil {
		uid = str(metaOf(old), "uid")
	}
	involved := map[string]any{"apiVersion": str(obj, "apiVersion"), "kind": str(obj, "kind"), "name": str(md, "name"), "uid": uid}
	if namespaced {
		involved["namespace"] = ns
	}
	msg := cause.Error()
	if len(msg) > 1024 {
		msg = msg[:1021] + "..."
	}
	now := time.Now()
	ev := map[string]any{
		"apiVersion": "v1", "kind": "Event",
		"metadata":       map[string]any{"name": fmt.Sprintf("%s.%x", str(md, "name"), now.UnixNano()), "namespace": ns},
		"involvedObject": involved,
		"reason":         invalidFileReason, "message": msg, "type": "Warning",
		"source":         map[string]any{"component": "dev-k8s"},
		"firstTimestamp": timestamp(now), "lastTimestamp": timestamp(now), "count": int64(1),
		"reportingComponent": "dev-k8s",
	}
	if s.ctx.Err() != nil {
		return
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		res, ok := s.reg.Lookup(schema.GroupVersionResource{Version: "v1", Resource: "events"})
		if !ok {
			return
		}
		if _, _, err := s.createObject(request{res: res, namespace: ns}, ev, false); err != nil {
			s.log.Error(err, "record event for an invalid file", "object", involved["name"])
		}
	}()
}

// fileChanged reports whether a hand edit changed more than metadata (and
// status, when withStatus: it has its own subresource).
func fileChanged(prev, obj map[string]any, withStatus bool) bool {
	for _, m := range []map[string]any{prev, obj} {
		for k := range m {
			if k == "metadata" || k == "apiVersion" || (withStatus && k == "status") {
				continue
			}
			if !jsonEqual(prev[k], obj[k]) {
				return true
			}
		}
	}
	return false
}
