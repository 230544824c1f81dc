package provider

import (
	"context"
	"time"
)

// Observer is told about every provider call: its operation (create,
// status, list, delete), how long it took and its error.
type Observer interface {
	ObserveCall(operation string, d time.Duration, err error)
}

// Instrumented returns p with every call reported to o.
func Instrumented(p Provider, o Observer) Provider { return instrumented{p: p, o: o} }

type instrumented struct {
	p Provider
	o Observer
}

func (i instrumented) observe(op string, start time.Time, err error) {
	i.o.ObserveCall(op, time.Since(start), err)
}

func (i instrumented) Create(ctx context.Context, req CreateRequest) (Instance, error) {
	start := time.Now()
	inst, err := i.p.Create(ctx, req)
	i.observe("create", start, err)
	return inst, err
}

func (i instrumented) Status(ctx context.Context, id string) (Instance, error) {
	start := time.Now()
	inst, err := i.p.Status(ctx, id)
	i.observe("status", start, err)
	return inst, err
}

func (i instrumented) List(ctx context.Context) ([]Instance, error) {
	start := time.Now()
	l, err := i.p.List(ctx)
	i.observe("list", start, err)
	return l, err
}

func (i instrumented) Delete(ctx context.Context, id string) error {
	start := time.Now()
	err := i.p.Delete(ctx, id)
	i.observe("delete", start, err)
	return err
}
