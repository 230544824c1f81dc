package apiserver

import (
	"fmt"
	"net/http"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/nstance-dev/nstance/internal/devk8s/auth"
)

// token answers a TokenRequest with a token for the service account that
// dev-k8s itself accepts (see internal/devk8s/auth) while the account exists.
func (s *Server) token(w http.ResponseWriter, r *http.Request, rq request) {
	body, err := s.readMap(r)
	if err != nil {
		writeError(w, err)
		return
	}
	var tr authenticationv1.TokenRequest
	if err := toTyped(body, &tr); err != nil {
		writeError(w, apierrors.NewBadRequest(fmt.Sprintf("decode TokenRequest: %v", err)))
		return
	}
	e, ok := s.store.Get(rq.res.StorageName(), rq.namespace, rq.name)
	if !ok {
		writeError(w, apierrors.NewNotFound(rq.res.GroupResource(), rq.name))
		return
	}
	if tr.Spec.ExpirationSeconds == nil {
		d := int64(3600)
		tr.Spec.ExpirationSeconds = &d
	}
	gk := schemaGK("authentication.k8s.io", "TokenRequest")
	if *tr.Spec.ExpirationSeconds < 600 {
		writeError(w, apierrors.NewInvalid(gk, "", field.ErrorList{field.Invalid(field.NewPath("spec", "expirationSeconds"), *tr.Spec.ExpirationSeconds, "may not specify a duration less than 10 minutes")}))
		return
	}
	if *tr.Spec.ExpirationSeconds > 1<<32 {
		writeError(w, apierrors.NewInvalid(gk, "", field.ErrorList{field.TooLong(field.NewPath("spec", "expirationSeconds"), *tr.Spec.ExpirationSeconds, 1<<32)}))
		return
	}
	if len(tr.Spec.Audiences) == 0 {
		tr.Spec.Audiences = []string{auth.Audience}
	}
	now := time.Now()
	exp := now.Add(time.Duration(*tr.Spec.ExpirationSeconds) * time.Second)
	tok, err := s.auth.IssueServiceAccountToken(rq.namespace, rq.name, str(metaOf(e.Object), "uid"), tr.Spec.Audiences, now, exp)
	if err != nil {
		writeError(w, apierrors.NewInternalError(err))
		return
	}
	tr.TypeMeta = metav1.TypeMeta{Kind: "TokenRequest", APIVersion: "authentication.k8s.io/v1"}
	tr.Name = rq.name
	tr.Namespace = rq.namespace
	tr.CreationTimestamp = metav1.Time{Time: now.Truncate(time.Second)}
	tr.Status = authenticationv1.TokenRequestStatus{Token: tok, ExpirationTimestamp: metav1.Time{Time: exp}}
	out, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&tr)
	if err != nil {
		writeError(w, apierrors.NewInternalError(err))
		return
	}
	writeJSON(w, http.StatusCreated, out)
}
