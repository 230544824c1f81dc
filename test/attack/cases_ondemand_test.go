package attack

import (
	"context"
	"fmt"
	"time"
)

// onDemandCases are the cases of issue 29 about on-demand pods: namespaces, pool opt-in, instance types, count (finding 5).
// They share one dev-k8s and nstance-operator, started by the first of them that runs.
func onDemandCases() []attackCase {
	od := &onDemandStack{}
	// run starts the shared stack first; the case then has its own minute.
	run := func(f func(ctx context.Context, e *env) error) func(ctx context.Context, e *env) error {
		return func(ctx context.Context, e *env) error {
			if err := od.start(ctx, e); err != nil {
				return err
			}
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 60*time.Second)
			defer cancel()
			return f(cctx, e)
		}
	}
	return []attackCase{
		{name: "on-demand pod in the operator's namespace for an opted-in pool launches an instance (control)", run: run(func(ctx context.Context, e *env) error {
			before, err := odInstances(ctx, e, odOpen)
			if err != nil {
				return err
			}
			if _, err := od.createPod(ctx, odNamespace, map[string]string{odAnnGroup: odOpen}); err != nil {
				return err
			}
			_, err = waitLaunch(ctx, e, odOpen, len(before), 45*time.Second)
			return err
		})},
		{name: "on-demand pod in another namespace launches nothing", run: run(func(ctx context.Context, e *env) error {
			return od.expectRefused(ctx, e, odAttackerNamespace, odOpen, map[string]string{odAnnGroup: odOpen}, "namespace")
		})},
		{name: "on-demand pod for a pool that did not opt in launches nothing", run: run(func(ctx context.Context, e *env) error {
			return od.expectRefused(ctx, e, odNamespace, odClosed, map[string]string{odAnnGroup: odClosed}, "spec.onDemand.enabled")
		})},
		{name: "on-demand pod asking for an instance type its pool does not allow launches nothing", run: run(func(ctx context.Context, e *env) error {
			return od.expectRefused(ctx, e, odNamespace, odOpen, map[string]string{odAnnGroup: odOpen, odAnnType: "p5.48xlarge"}, "instance type")
		})},
		{name: "on-demand pod beyond its pool's maxInstances launches nothing", run: run(func(ctx context.Context, e *env) error {
			// The pool allows one: the first pod gets it.
			before, err := odInstances(ctx, e, odQuota)
			if err != nil {
				return err
			}
			if len(before) == 0 {
				if _, err := od.createPod(ctx, odNamespace, map[string]string{odAnnGroup: odQuota}); err != nil {
					return err
				}
				if _, err := waitLaunch(ctx, e, odQuota, 0, 45*time.Second); err != nil {
					return fmt.Errorf("the first pod within maxInstances: %w", err)
				}
			}
			return od.expectRefused(ctx, e, odNamespace, odQuota, map[string]string{odAnnGroup: odQuota}, "maxInstances")
		})},
	}
}
