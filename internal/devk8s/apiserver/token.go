package apiserver

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

const defaultAudience = "https://kubernetes.default.svc.cluster.local"

// token answers a TokenRequest with a signed JWT for the service account.
// The signature uses a per-server secret: dev-k8s only needs clients to get
// a well-formed token, not to verify it.
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
		tr.Spec.Audiences = []string{defaultAudience}
	}
	now := time.Now()
	exp := now.Add(time.Duration(*tr.Spec.ExpirationSeconds) * time.Second)
	md := metaOf(e.Object)
	claims := map[string]any{
		"aud": tr.Spec.Audiences,
		"exp": exp.Unix(),
		"iat": now.Unix(),
		"nbf": now.Unix(),
		"iss": defaultAudience,
		"sub": "system:serviceaccount:" + rq.namespace + ":" + rq.name,
		"kubernetes.io": map[string]any{
			"namespace":      rq.namespace,
			"serviceaccount": map[string]string{"name": rq.name, "uid": str(md, "uid")},
		},
	}
	tok, err := s.signJWT(claims)
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

func (s *Server) signJWT(claims map[string]any) (string, error) {
	header := base64.RawURLEncoding.EncodeToString([]byte(`{"alg":"HS256","typ":"JWT"}`))
	payload, err := json.Marshal(claims)
	if err != nil {
		return "", fmt.Errorf("encode token claims: %w", err)
	}
	unsigned := header + "." + base64.RawURLEncoding.EncodeToString(payload)
	mac := hmac.New(sha256.New, s.tokenKey)
	mac.Write([]byte(unsigned))
	return unsigned + "." + base64.RawURLEncoding.EncodeToString(mac.Sum(nil)), nil
}
