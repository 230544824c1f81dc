package memstore_test

import (
	"testing"

	"github.com/nstance-dev/nstance/pkg/objstore"
	"github.com/nstance-dev/nstance/pkg/objstore/memstore"
	"github.com/nstance-dev/nstance/pkg/objstore/objstoretest"
)

func TestContract(t *testing.T) {
	objstoretest.Run(t, func(t *testing.T) objstore.Store { return memstore.New() })
}
