package capacity

import (
	"context"
	"fmt"

	"github.com/nstance-dev/nstance/internal/operator/shardconn"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// Shards describes instance types over the operator's shard connections.
type Shards struct {
	Conns *shardconn.Manager
}

// Describe implements Describer.
func (s Shards) Describe(ctx context.Context, shard string, req *nstancev1.DescribeInstanceTypeRequest) (*nstancev1.InstanceTypeInfo, error) {
	c, err := s.Conns.Client(shard)
	if err != nil {
		return nil, err
	}
	resp, err := c.DescribeInstanceType(ctx, req)
	if err != nil {
		return nil, fmt.Errorf("DescribeInstanceType: %w", err)
	}
	return resp.GetInstanceType(), nil
}
