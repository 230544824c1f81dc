// Package webhook serves the operator's validating admission webhooks for
// static pools: NstanceMachinePools that mirror a group defined in a shard's
// config file, and their MachinePools (whose replica count the config file
// fixes).
package webhook

import (
	"context"
	"fmt"
	"slices"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	infrav1 "github.com/nstance-dev/nstance/api/v1beta1"
)

// StaticAnnotation marks an NstanceMachinePool that mirrors a static server
// group (one defined in the shard config files rather than through the
// operator). Its template, subnet pool and shards are fixed by those files,
// so the webhook rejects changes to them, and the marker cannot be removed.
const StaticAnnotation = "nstance.dev/static"

// StaticLabel marks the MachinePool of a static pool. It is a label, not an
// annotation, so the chart's webhook entry for MachinePools selects only
// these (objectSelector) and core Cluster API's updates of every other
// MachinePool never wait for the operator.
const StaticLabel = "nstance.dev/static"

// Path is where controller-runtime serves the validator (the chart's
// ValidatingWebhookConfiguration points there).
const Path = "/validate-infrastructure-cluster-x-k8s-io-v1beta1-nstancemachinepool"

// MachinePoolPath is where the MachinePool validator is served.
const MachinePoolPath = "/validate-cluster-x-k8s-io-v1beta2-machinepool"

// PoolValidator validates NstanceMachinePool changes.
type PoolValidator struct{}

var _ admission.Validator[*infrav1.NstanceMachinePool] = PoolValidator{}

// Setup registers the validators with the manager's webhook server.
func Setup(mgr ctrl.Manager) error {
	if err := ctrl.NewWebhookManagedBy(mgr, &infrav1.NstanceMachinePool{}).WithValidator(PoolValidator{}).Complete(); err != nil {
		return err
	}
	return ctrl.NewWebhookManagedBy(mgr, &clusterv1.MachinePool{}).WithValidator(MachinePoolValidator{}).Complete()
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

// MachinePoolValidator refuses scaling the MachinePool of a static pool:
// the server sizes a static group from its config file and refuses any
// other size, so a scale here could only leave the pool rejected.
type MachinePoolValidator struct{}

var _ admission.Validator[*clusterv1.MachinePool] = MachinePoolValidator{}

func isStaticMachinePool(mp *clusterv1.MachinePool) bool { return mp.Labels[StaticLabel] == "true" }

// ValidateCreate accepts every MachinePool.
func (MachinePoolValidator) ValidateCreate(context.Context, *clusterv1.MachinePool) (admission.Warnings, error) {
	return nil, nil
}

// ValidateUpdate rejects a replica change or the marker's removal on a
// static pool's MachinePool.
func (MachinePoolValidator) ValidateUpdate(_ context.Context, oldMP, newMP *clusterv1.MachinePool) (admission.Warnings, error) {
	if !isStaticMachinePool(oldMP) {
		return nil, nil
	}
	var errs field.ErrorList
	if !isStaticMachinePool(newMP) {
		errs = append(errs, field.Forbidden(field.NewPath("metadata", "labels").Key(StaticLabel), "a static pool stays static"))
	}
	if o, n := ptr.Deref(oldMP.Spec.Replicas, 0), ptr.Deref(newMP.Spec.Replicas, 0); o != n {
		errs = append(errs, field.Forbidden(field.NewPath("spec", "replicas"), fmt.Sprintf(
			"the static group is sized by the shard config files (%d instances); change the size there, not to %d", o, n)))
	}
	if len(errs) == 0 {
		return nil, nil
	}
	return nil, apierrors.NewInvalid(clusterv1.GroupVersion.WithKind("MachinePool").GroupKind(), newMP.Name, errs)
}

// ValidateDelete accepts deletions.
func (MachinePoolValidator) ValidateDelete(context.Context, *clusterv1.MachinePool) (admission.Warnings, error) {
	return nil, nil
}
