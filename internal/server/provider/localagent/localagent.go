package localagent

import (
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"os"
	"path/filepath"
	"sort"
	"time"

	"github.com/nstance-dev/nstance/internal/server/provider"
)

// Environment variable names handed to every local agent.
const (
	EnvInstanceID       = "NSTANCE_INSTANCE_ID"
	EnvProviderID       = "NSTANCE_PROVIDER_ID"
	EnvShard            = "NSTANCE_SHARD"
	EnvIdentityDir      = "NSTANCE_IDENTITY_DIR"
	EnvRegistrationAddr = "NSTANCE_REGISTRATION_ADDR"
	EnvAgentAddr        = "NSTANCE_AGENT_ADDR"
	// EnvHealthAddr is where the agent serves GET /healthz (set by a
	// provider's HealthPort).
	EnvHealthAddr = "NSTANCE_HEALTH_ADDR"
	// EnvUserData is the instance's own bootstrap script, which the agent
	// runs after its first files (package agent/userdata).
	EnvUserData = "NSTANCE_USER_DATA"
)

// LoopbackAddr is the loopback address a provider's HealthPort gives the
// agent of instance id: 127.a.b.c from a hash of the id, never 127.0.0.x.
func LoopbackAddr(id string) string {
	h := fnv.New32a()
	_, _ = h.Write([]byte(id))
	v := h.Sum32()
	return fmt.Sprintf("127.%d.%d.%d", 1+byte(v>>16)%254, byte(v>>8), 1+byte(v)%254)
}

// UserDataFile is the instance's bootstrap data inside its directory.
const UserDataFile = "user-data"

// UserDataPath is the bootstrap data file of one instance.
func UserDataPath(stateDir, instanceID string) string {
	return filepath.Join(InstanceDir(stateDir, instanceID), UserDataFile)
}

// File names inside the identity directory.
const (
	NonceFile = "nonce.jwt"
	CAFile    = "ca.crt"
)

// InstanceDir is the directory of one instance under stateDir.
func InstanceDir(stateDir, instanceID string) string { return filepath.Join(stateDir, instanceID) }

// IdentityDir is where the nonce and CA of one instance are written.
func IdentityDir(stateDir, instanceID string) string {
	return filepath.Join(InstanceDir(stateDir, instanceID), "identity")
}

// Prepare creates the instance directory and writes the identity files
// (nonce mode 0600, CA 0644). It returns the identity directory.
func Prepare(stateDir string, req provider.CreateRequest) (string, error) {
	if err := provider.ValidateInstanceID(req.InstanceID); err != nil {
		return "", err
	}
	dir := IdentityDir(stateDir, req.InstanceID)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", fmt.Errorf("creating identity dir: %w", err)
	}
	if err := writeAtomic(filepath.Join(dir, NonceFile), []byte(req.AgentNonce), 0o600); err != nil {
		return "", err
	}
	if err := writeAtomic(filepath.Join(dir, CAFile), req.CACertPEM, 0o644); err != nil {
		return "", err
	}
	if len(req.UserData) > 0 {
		// Only the instance's own user may read it: it may hold join tokens.
		if err := writeAtomic(UserDataPath(stateDir, req.InstanceID), req.UserData, 0o700); err != nil {
			return "", err
		}
	}
	return dir, nil
}

// Env returns the agent environment as sorted KEY=VALUE pairs.
func Env(stateDir string, req provider.CreateRequest) []string {
	m := map[string]string{
		EnvInstanceID:  req.InstanceID,
		EnvProviderID:  req.ProviderID,
		EnvShard:       req.Shard,
		EnvIdentityDir: IdentityDir(stateDir, req.InstanceID),
	}
	if req.RegistrationAddr != "" {
		m[EnvRegistrationAddr] = req.RegistrationAddr
	}
	if req.AgentAddr != "" {
		m[EnvAgentAddr] = req.AgentAddr
	}
	if len(req.UserData) > 0 {
		p := UserDataPath(stateDir, req.InstanceID)
		if abs, err := filepath.Abs(p); err == nil {
			p = abs
		}
		m[EnvUserData] = p
	}
	out := make([]string, 0, len(m))
	for k, v := range m {
		out = append(out, k+"="+v)
	}
	sort.Strings(out)
	return out
}

// Cleanup removes the instance directory.
func Cleanup(stateDir, instanceID string) error {
	if err := os.RemoveAll(InstanceDir(stateDir, instanceID)); err != nil {
		return fmt.Errorf("removing instance dir: %w", err)
	}
	return nil
}

// NodePath is the fake Node file of an instance: {nodeDir}/{instanceID}.json.
func NodePath(nodeDir, instanceID string) string {
	return filepath.Join(nodeDir, instanceID+".json")
}

// Node is the subset of a Kubernetes Node the fake file carries.
type Node struct {
	APIVersion string       `json:"apiVersion"`
	Kind       string       `json:"kind"`
	Metadata   NodeMetadata `json:"metadata"`
	Spec       NodeSpec     `json:"spec"`
	Status     NodeStatus   `json:"status"`
}

// NodeMetadata is the Node's object metadata.
type NodeMetadata struct {
	Name              string            `json:"name"`
	Labels            map[string]string `json:"labels,omitempty"`
	CreationTimestamp string            `json:"creationTimestamp"`
}

// NodeSpec holds the provider id that links the Node to its machine.
type NodeSpec struct {
	ProviderID string `json:"providerID"`
}

// NodeStatus reports the Node healthy, as a kubelet would, with its
// addresses.
type NodeStatus struct {
	Conditions []NodeCondition `json:"conditions"`
	Addresses  []NodeAddress   `json:"addresses"`
}

// NodeCondition is one Node condition.
type NodeCondition struct {
	Type               string `json:"type"`
	Status             string `json:"status"`
	Reason             string `json:"reason"`
	Message            string `json:"message,omitempty"`
	LastHeartbeatTime  string `json:"lastHeartbeatTime"`
	LastTransitionTime string `json:"lastTransitionTime"`
}

// kubeletConditions is the condition set a healthy kubelet reports: Ready
// true and the three pressure conditions false. Core Cluster API's
// NodeHealthy condition reads all four and is Unknown while one is missing.
// NetworkUnavailable is left out: the kubelet does not report it (a CNI
// plugin or cloud route controller does), and a Node without it counts as
// having its network.
func kubeletConditions(ts string) []NodeCondition {
	c := func(typ, status, reason, msg string) NodeCondition {
		return NodeCondition{Type: typ, Status: status, Reason: reason, Message: msg, LastHeartbeatTime: ts, LastTransitionTime: ts}
	}
	return []NodeCondition{
		c("MemoryPressure", "False", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
		c("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
		c("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
		c("Ready", "True", "KubeletReady", "kubelet is posting ready status"),
	}
}

// NodeAddress is one Node address.
type NodeAddress struct {
	Type    string `json:"type"`
	Address string `json:"address"`
}

// WriteNode writes the fake Node for req into nodeDir (no-op when nodeDir is
// empty). spec.providerID is exactly req.ProviderID.
func WriteNode(nodeDir string, req provider.CreateRequest, now time.Time) error {
	if nodeDir == "" {
		return nil
	}
	if err := os.MkdirAll(nodeDir, 0o755); err != nil {
		return fmt.Errorf("creating node dir: %w", err)
	}
	ts := now.UTC().Format(time.RFC3339)
	labels := map[string]string{
		"kubernetes.io/hostname":  req.InstanceID,
		"nstance.dev/instance-id": req.InstanceID,
		"nstance.dev/shard":       req.Shard,
		"node.kubernetes.io/exclude-from-external-load-balancers": "true",
	}
	if req.GroupID != "" {
		labels["nstance.dev/group"] = req.GroupID
	}
	if req.InstanceType != "" {
		labels["node.kubernetes.io/instance-type"] = req.InstanceType
	}
	n := Node{
		APIVersion: "v1",
		Kind:       "Node",
		Metadata:   NodeMetadata{Name: req.InstanceID, Labels: labels, CreationTimestamp: ts},
		Spec:       NodeSpec{ProviderID: req.ProviderID},
		Status: NodeStatus{
			Conditions: kubeletConditions(ts),
			Addresses: []NodeAddress{
				{Type: "InternalIP", Address: "127.0.0.1"},
				{Type: "Hostname", Address: req.InstanceID},
			},
		},
	}
	b, err := json.MarshalIndent(n, "", "  ")
	if err != nil {
		return fmt.Errorf("encoding node: %w", err)
	}
	return writeAtomic(NodePath(nodeDir, req.InstanceID), append(b, '\n'), 0o644)
}

// RemoveNode deletes the fake Node file; a missing file is not an error.
func RemoveNode(nodeDir, instanceID string) error {
	if nodeDir == "" {
		return nil
	}
	if err := os.Remove(NodePath(nodeDir, instanceID)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("removing node file: %w", err)
	}
	return nil
}

func writeAtomic(path string, data []byte, mode os.FileMode) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	name := tmp.Name()
	_, werr := tmp.Write(data)
	cerr := tmp.Close()
	if werr == nil {
		werr = cerr
	}
	if werr == nil {
		werr = os.Chmod(name, mode)
	}
	if werr == nil {
		werr = os.Rename(name, path)
	}
	if werr != nil {
		_ = os.Remove(name)
		return fmt.Errorf("writing %s: %w", path, werr)
	}
	return nil
}
