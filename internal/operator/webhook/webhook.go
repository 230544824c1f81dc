// Package webhook serves the operator's validating admission webhook for
// NstanceMachinePools.
package webhook

import (
	"context"
	"slices"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/validation/field"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	infrav1 "github.com/nstance-dev/nstance/api/v1beta1"
)

// StaticAnnotation marks an NstanceMachinePool that mirrors a static server
// group (one defined in the shard config files rather than through the
// operator). Its template, subnet pool and shards are fixed by those files,
// so the webhook rejects changes to them, and the marker cannot be removed.
const StaticAnnotation = "nstance.dev/static"

// Path is where controller-runtime serves the validator (the chart's
// ValidatingWebhookConfiguration points there).
const Path = "/validate-infrastructure-cluster-x-k8s-io-v1beta1-nstancemachinepool"

// PoolValidator validates NstanceMachinePool changes.
type PoolValidator struct{}

var _ admission.Validator[*infrav1.NstanceMachinePool] = PoolValidator{}

// Setup registers the validator with the manager's webhook server.
func Setup(mgr ctrl.Manager) error {
	return ctrl.NewWebhookManagedBy(mgr, &infrav1.NstanceMachinePool{}).WithValidator(PoolValidator{}).Complete()
}

// IsStatic reports whether the pool is marked static.
func IsStatic(p *infrav1.NstanceMachinePool) bool { return p.Annotations[StaticAnnotation] == "true" }

// ValidateCreate accepts every pool (the CRD schema checks fields).
func (PoolValidator) ValidateCreate(context.Context, *infrav1.NstanceMachinePool) (admission.Warnings, error) {
	return nil, nil
}

// ValidateUpdate rejects changes to the fixed fields of a static pool.
func (PoolValidator) ValidateUpdate(_ context.Context, oldP, newP *infrav1.NstanceMachinePool) (admission.Warnings, error) {
	if !IsStatic(oldP) {
		return nil, nil
	}
	var errs field.ErrorList
	spec := field.NewPath("spec")
	if !IsStatic(newP) {
		errs = append(errs, field.Forbidden(field.NewPath("metadata", "annotations").Key(StaticAnnotation), "a static pool stays static"))
	}
	if oldP.Spec.Template != newP.Spec.Template {
		errs = append(errs, field.Forbidden(spec.Child("template"), "immutable on a static pool"))
	}
	if oldP.Spec.SubnetPool != newP.Spec.SubnetPool {
		errs = append(errs, field.Forbidden(spec.Child("subnetPool"), "immutable on a static pool"))
	}
	if !slices.Equal(oldP.Spec.Shards, newP.Spec.Shards) {
		errs = append(errs, field.Forbidden(spec.Child("shards"), "immutable on a static pool"))
	}
	if len(errs) == 0 {
		return nil, nil
	}
	return nil, apierrors.NewInvalid(infrav1.GroupVersion.WithKind("NstanceMachinePool").GroupKind(), newP.Name, errs)
}

// ValidateDelete accepts deletions.
func (PoolValidator) ValidateDelete(context.Context, *infrav1.NstanceMachinePool) (admission.Warnings, error) {
	return nil, nil
}
