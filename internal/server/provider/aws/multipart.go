package aws

import (
	"github.com/nstance-dev/nstance/internal/server/provider"
	"github.com/nstance-dev/nstance/internal/server/provider/cloudinit"
)

// ComposeUserData is the user data an EC2 instance boots with
// (cloudinit.Compose within EC2's limit, MaxUserData: a larger document is
// gzip-compressed, one still too large refused).
func ComposeUserData(agentScript []byte, req provider.CreateRequest) ([]byte, error) {
	return cloudinit.Compose(agentScript, req, cloudinit.Platform{Name: "EC2", MaxBytes: MaxUserData})
}
