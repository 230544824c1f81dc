package apiserver

import (
	"net/http"

	authenticationv1 "k8s.io/api/authentication/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/nstance-dev/nstance/internal/devk8s/auth"
)

const selfSubjectReviewPath = "apis/authentication.k8s.io/v1/selfsubjectreviews"

// selfSubjectReview answers `kubectl auth whoami`: the authenticated user of
// the request, as kube-apiserver reports it.
func (s *Server) selfSubjectReview(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		writeError(w, apierrors.NewMethodNotSupported(schema.GroupResource{Group: "authentication.k8s.io", Resource: "selfsubjectreviews"}, r.Method))
		return
	}
	if _, err := s.readMap(r); err != nil {
		writeError(w, err)
		return
	}
	u, ok := auth.UserFrom(r.Context())
	if !ok {
		writeError(w, apierrors.NewUnauthorized("Unauthorized"))
		return
	}
	info := authenticationv1.UserInfo{Username: u.GetName(), UID: u.GetUID(), Groups: u.GetGroups()}
	if extra := u.GetExtra(); len(extra) > 0 {
		info.Extra = map[string]authenticationv1.ExtraValue{}
		for k, v := range extra {
			info.Extra[k] = v
		}
	}
	writeJSON(w, http.StatusCreated, &authenticationv1.SelfSubjectReview{
		TypeMeta: metav1.TypeMeta{Kind: "SelfSubjectReview", APIVersion: "authentication.k8s.io/v1"},
		Status:   authenticationv1.SelfSubjectReviewStatus{UserInfo: info},
	})
}
