//go:build !linux

package leaderaddr

import (
	"context"
	"errors"
)

type heldVIP struct{}

var errNotLinux = errors.New("leader address: mode vip needs Linux")

// Acquire fails: VIPs are managed through Linux netlink.
func (v *VIP) Acquire(context.Context) error { return errNotLinux }

// Release fails: VIPs are managed through Linux netlink.
func (v *VIP) Release(context.Context) error { return errNotLinux }

// Held fails: VIPs are managed through Linux netlink.
func (v *VIP) Held() (bool, error) { return false, errNotLinux }
