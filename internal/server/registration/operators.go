package registration

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/nstance-dev/nstance/internal/layout"
	"github.com/nstance-dev/nstance/pkg/objstore"
)

// Operator records are kept per tenant and id
// (cluster/operators/{tenant}/{id}.json): operator ids are scoped to their
// tenant like their certificates' SPIFFE URIs, so two tenants may register
// the same id without touching each other's record. Versions before this
// layout wrote cluster/operators/{id}.json for every tenant; such a record
// is still honoured for the tenant it names (read through, never for
// another tenant) until the operator registers again or is revoked, so an
// upgraded cluster keeps serving its operators. Records are never moved:
// an older server still running during the upgrade would take a vanished
// legacy record for a revocation.

// StoredOperator is an operator record with where it was read from.
type StoredOperator struct {
	Record OperatorRecord
	// Key is the object the record was read from (the legacy key for a
	// record written before tenant-scoped ids) and ETag its version.
	Key, ETag string
	// Legacy is true when Key is the legacy {id}.json.
	Legacy bool
}

// ErrOperatorUnreadable wraps a record that exists but does not parse.
var ErrOperatorUnreadable = errors.New("operator record is unreadable")

// ReadOperatorRecord reads the record of operator id of tenant: the
// tenant-scoped key, else a legacy record that names this tenant. A legacy
// record of another tenant is not this operator's: objstore.ErrNotFound.
func ReadOperatorRecord(ctx context.Context, store objstore.Store, keys layout.Keys, tenant, id string) (*StoredOperator, error) {
	if err := layout.ValidateID("tenant", tenant); err != nil {
		return nil, err
	}
	if err := layout.ValidateID("operator id", id); err != nil {
		return nil, err
	}
	for _, legacy := range []bool{false, true} {
		key := keys.Operator(tenant, id)
		if legacy {
			key = keys.LegacyOperator(id)
		}
		obj, err := store.Get(ctx, key)
		if errors.Is(err, objstore.ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("reading %s: %w", key, err)
		}
		var rec OperatorRecord
		if err := json.Unmarshal(obj.Body, &rec); err != nil {
			if legacy {
				// Which tenant it belonged to is unknown: it is nobody's.
				return nil, fmt.Errorf("%s: %w: %v (%w)", key, ErrOperatorUnreadable, err, objstore.ErrNotFound)
			}
			return nil, fmt.Errorf("%s: %w: %v", key, ErrOperatorUnreadable, err)
		}
		if legacy && rec.Tenant != tenant {
			break
		}
		if rec.ID == "" {
			rec.ID = id
		}
		return &StoredOperator{Record: rec, Key: key, ETag: obj.ETag, Legacy: legacy}, nil
	}
	return nil, fmt.Errorf("operator %s of tenant %s: %w", id, tenant, objstore.ErrNotFound)
}

// WriteOperatorRecord stores rec at its tenant-scoped key.
func WriteOperatorRecord(ctx context.Context, store objstore.Store, keys layout.Keys, rec OperatorRecord) error {
	body, err := json.Marshal(rec)
	if err != nil {
		return fmt.Errorf("encoding the record of operator %s: %w", rec.ID, err)
	}
	key := keys.Operator(rec.Tenant, rec.ID)
	if _, err := store.Put(ctx, key, body, objstore.PutOptions{}); err != nil {
		return fmt.Errorf("writing %s: %w", key, err)
	}
	return nil
}
