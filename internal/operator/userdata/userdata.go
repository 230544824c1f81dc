package userdata

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Bootstrap data Secrets live beside their Machines, which the operator
// reconciles in its own namespace; the namespaced Role grants them there.
// +kubebuilder:rbac:groups="",namespace=nstance-system,resources=secrets,verbs=get

// Keys of a Cluster API bootstrap data Secret.
const (
	KeyValue  = "value"
	KeyFormat = "format"
)

// Formats a bootstrap data Secret may name.
const (
	FormatCloudConfig = "cloud-config"
	FormatIgnition    = "ignition"
)

// Data is the content of a bootstrap data Secret. The zero value means none:
// the instance template's own userdata applies.
type Data struct {
	// Secret is the name the data was read from ("" for none).
	Secret string
	Value  []byte
	Format string
}

// Empty reports whether d carries no data.
func (d Data) Empty() bool { return len(d.Value) == 0 }

// Hash is the lowercase hex SHA-256 of the value, "" when there is none: the
// form the server reports in GroupStatus.user_data_sha256.
func (d Data) Hash() string { return Hash(d.Value) }

// Hash returns the lowercase hex SHA-256 of b, or "" when b is empty.
func Hash(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// InvalidError says why a bootstrap data Secret that exists cannot be used.
// Its message names the Secret and the problem, never the content.
type InvalidError struct {
	Namespace, Name, Problem string
}

func (e *InvalidError) Error() string {
	return fmt.Sprintf("bootstrap data Secret %s/%s: %s", e.Namespace, e.Name, e.Problem)
}

// NotFoundError: the named bootstrap data Secret does not exist (yet).
type NotFoundError struct {
	Namespace, Name string
}

func (e *NotFoundError) Error() string {
	return fmt.Sprintf("bootstrap data Secret %s/%s not found", e.Namespace, e.Name)
}

// SecretName interprets a dataSecretName field of Cluster API's Bootstrap:
// nil means the bootstrap provider has not produced the data yet (wait);
// "" means the Machine has no bootstrap data on purpose (Cluster API's own
// MachinePool Machines, and the operator's on-demand and imported objects,
// are written so), and the template's userdata applies.
func SecretName(dataSecretName *string) (name string, ready bool) {
	if dataSecretName == nil {
		return "", false
	}
	return *dataSecretName, true
}

// Bootstrap data Secrets live beside their Machines and pools. The
// operator's own Role grants get in its namespace only: its Secret access
// ends there by design (internal/packaging tests it). Pools in other
// namespaces need a RoleBinding there granting get on secrets to the
// operator's service account (docs/operator.md); without it Read returns
// the API's Forbidden error, which the pool reports.

// Read returns the bootstrap data of the Secret namespace/name; an empty
// name returns the zero Data. Errors are *NotFoundError, *InvalidError (no
// or an empty "value", an unknown "format") or the API error, wrapped.
func Read(ctx context.Context, r client.Reader, namespace, name string) (Data, error) {
	if name == "" {
		return Data{}, nil
	}
	var s corev1.Secret
	if err := r.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, &s); err != nil {
		if apierrors.IsNotFound(err) {
			return Data{}, &NotFoundError{Namespace: namespace, Name: name}
		}
		return Data{}, fmt.Errorf("get bootstrap data Secret %s/%s: %w", namespace, name, err)
	}
	value, ok := s.Data[KeyValue]
	if !ok {
		return Data{}, &InvalidError{Namespace: namespace, Name: name, Problem: "key " + KeyValue + " is missing"}
	}
	if len(value) == 0 {
		return Data{}, &InvalidError{Namespace: namespace, Name: name, Problem: "key " + KeyValue + " is empty"}
	}
	format := string(s.Data[KeyFormat])
	switch format {
	case "":
		format = FormatCloudConfig
	case FormatCloudConfig, FormatIgnition:
	default:
		return Data{}, &InvalidError{Namespace: namespace, Name: name,
			Problem: fmt.Sprintf("key %s is %q; want %q or %q", KeyFormat, format, FormatCloudConfig, FormatIgnition)}
	}
	return Data{Secret: name, Value: value, Format: format}, nil
}
