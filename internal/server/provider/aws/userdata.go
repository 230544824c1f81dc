package aws

import (
	"fmt"

	"github.com/nstance-dev/nstance/internal/server/provider"
	"github.com/nstance-dev/nstance/internal/server/provider/cloudinit"
)

// MaxUserData is EC2's limit on user data before base64 encoding.
const MaxUserData = 16 << 10

// Agent says where the user-data script puts the agent's files and how it
// starts the agent the image carries (cloudinit.Agent).
type Agent = cloudinit.Agent

// UserData renders the agent's bootstrap script (cloudinit.AgentScript),
// refused above EC2's limit. On EC2 the agent finds out from the instance
// metadata whether the instance is spot and then watches for its
// interruption notice (its default NSTANCE_SPOT_NOTICE=auto; extra may set
// off).
func UserData(agent Agent, req provider.CreateRequest, extra []string) ([]byte, error) {
	b, err := cloudinit.AgentScript(agent, req, extra)
	if err != nil {
		return nil, err
	}
	if len(b) > MaxUserData {
		return nil, fmt.Errorf("user data is %d bytes, EC2 allows %d (is the CA bundle that large?)", len(b), MaxUserData)
	}
	return b, nil
}
