package apiserver

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/nstance-dev/nstance/internal/devk8s/store"
)

const initialEventsEnd = "k8s.io/initial-events-end"

type watchWriter struct {
	w       http.ResponseWriter
	flusher http.Flusher
	s       *Server
	rq      request
	table   bool
	r       *http.Request
}

func (ww *watchWriter) send(typ watch.EventType, obj []byte) error {
	var buf bytes.Buffer
	buf.Grow(len(obj) + 32)
	fmt.Fprintf(&buf, `{"type":%q,"object":`, typ)
	buf.Write(obj)
	buf.WriteString("}\n")
	if _, err := ww.w.Write(buf.Bytes()); err != nil {
		return err
	}
	if ww.flusher != nil {
		ww.flusher.Flush()
	}
	return nil
}

func (ww *watchWriter) sendEntry(typ watch.EventType, e *store.Entry) error {
	if ww.table {
		t, err := ww.s.table(ww.rq.res, []*store.Entry{e}, "", ww.r)
		if err != nil {
			return err
		}
		data, err := json.Marshal(t)
		if err != nil {
			return err
		}
		return ww.send(typ, data)
	}
	return ww.send(typ, entryBytes(ww.rq.res, e))
}

func (ww *watchWriter) bookmark(rv uint64, initialEnd bool) error {
	md := map[string]any{"resourceVersion": strconv.FormatUint(rv, 10)}
	if initialEnd {
		md["annotations"] = map[string]string{initialEventsEnd: "true"}
	}
	data, _ := json.Marshal(map[string]any{"kind": ww.rq.res.Kind, "apiVersion": ww.rq.res.APIVersion(), "metadata": md})
	return ww.send(watch.Bookmark, data)
}

func (s *Server) watch(w http.ResponseWriter, r *http.Request, rq request) {
	q := r.URL.Query()
	sel, err := s.parseSelectors(rq.res, q.Get("labelSelector"), q.Get("fieldSelector"))
	if err != nil {
		writeError(w, err)
		return
	}
	rvParam := q.Get("resourceVersion")
	fromRV, err := parseRV(rvParam)
	if err != nil {
		writeError(w, apierrors.NewBadRequest(fmt.Sprintf("invalid resource version: %v", err)))
		return
	}
	bookmarks := isTrue(q.Get("allowWatchBookmarks"))
	sendInitial := rvParam == "" || rvParam == "0"
	initialEnd := false
	if v := q.Get("sendInitialEvents"); v != "" {
		if q.Get("resourceVersionMatch") != string(metav1.ResourceVersionMatchNotOlderThan) || !bookmarks {
			writeError(w, apierrors.NewInvalid(schemaGK("meta.k8s.io", "ListOptions"), "", nil))
			return
		}
		sendInitial = isTrue(v)
		initialEnd = sendInitial
	}
	var timeout <-chan time.Time
	if v := q.Get("timeoutSeconds"); v != "" {
		if n, err := strconv.Atoi(v); err == nil && n > 0 {
			t := time.NewTimer(time.Duration(n) * time.Second)
			defer t.Stop()
			timeout = t.C
		}
	}
	start, err := s.store.Watch(rq.res.StorageName(), rq.namespace, fromRV, sendInitial)
	ww := &watchWriter{w: w, s: s, rq: rq, table: wantsTable(r), r: r}
	ww.flusher, _ = w.(http.Flusher)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Transfer-Encoding", "chunked")
	w.Header().Set("Cache-Control", "no-cache, private")
	var expired *store.ExpiredError
	if errors.As(err, &expired) {
		w.WriteHeader(http.StatusOK)
		st := apierrors.NewResourceExpired(expired.Error()).ErrStatus
		st.Kind, st.APIVersion = "Status", "v1"
		data, _ := json.Marshal(&st)
		_ = ww.send(watch.Error, data)
		return
	}
	if errors.Is(err, store.ErrStopping) {
		writeError(w, apierrors.NewServiceUnavailable(err.Error()))
		return
	}
	if err != nil {
		writeError(w, err)
		return
	}
	defer start.Watcher.Stop()
	w.WriteHeader(http.StatusOK)
	if ww.flusher != nil {
		ww.flusher.Flush()
	}
	lastRV := fromRV
	if sendInitial {
		lastRV = start.RV
	}
	deliver := func(ev store.Event) error {
		if ev.RV > lastRV {
			lastRV = ev.RV
		}
		typ, obj := filterEvent(sel, ev)
		if typ == "" {
			return nil
		}
		return ww.sendEntry(typ, obj)
	}
	for _, ev := range start.Initial {
		if err := deliver(ev); err != nil {
			return
		}
	}
	if sendInitial {
		lastRV = start.RV
	}
	if initialEnd {
		if err := ww.bookmark(lastRV, true); err != nil {
			return
		}
	}
	var tick <-chan time.Time
	if bookmarks {
		t := time.NewTicker(s.opts.BookmarkInterval)
		defer t.Stop()
		tick = t.C
	}
	events := start.Watcher.Events()
	for {
		select {
		case <-r.Context().Done():
			return
		case <-timeout:
			return
		case <-tick:
			rv := s.store.CurrentRV()
			if len(events) == 0 && rv > lastRV {
				lastRV = rv
			}
			if err := ww.bookmark(lastRV, false); err != nil {
				return
			}
		case ev, ok := <-events:
			if !ok {
				return // overflowed or stopped: the client starts again
			}
			if err := deliver(ev); err != nil {
				return
			}
		}
	}
}

// filterEvent applies selectors the way kube-apiserver does: an object
// that starts or stops matching appears as ADDED or DELETED.
func filterEvent(sel *selector, ev store.Event) (watch.EventType, *store.Entry) {
	var oldObj map[string]any
	if ev.Old != nil {
		oldObj = ev.Old.Object
	}
	newMatch := sel.matches(ev.Object.Object)
	switch ev.Type {
	case watch.Added:
		if newMatch {
			return watch.Added, ev.Object
		}
	case watch.Deleted:
		if sel.matches(oldObj) || newMatch {
			return watch.Deleted, ev.Object
		}
	case watch.Modified:
		oldMatch := sel.matches(oldObj)
		switch {
		case newMatch && oldMatch:
			return watch.Modified, ev.Object
		case newMatch:
			return watch.Added, ev.Object
		case oldMatch:
			return watch.Deleted, ev.Object
		}
	}
	return "", nil
}
