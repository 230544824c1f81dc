package proxmox

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sort"
	"strconv"
	"strings"

	pve "github.com/luthermonson/go-proxmox"
)

// Client is API on github.com/luthermonson/go-proxmox with API token
// authentication.
type Client struct {
	c *pve.Client
}

var _ API = (*Client)(nil)

// NewClient returns the client of o with the token's secret. hc, when not
// nil, is the HTTP client to use (tests); otherwise one is built with the
// request timeout and o's TLS settings. Requests failing with a network
// error, 502, 503, 504 or 429 are retried (go-proxmox's WithRetry: three
// attempts with jittered backoff).
func NewClient(o Options, secret string, hc *http.Client) (*Client, error) {
	opts := []pve.Option{pve.WithAPIToken(o.TokenID, secret), pve.WithUserAgent("nstance-server"), pve.WithRetry()}
	if hc != nil {
		opts = append(opts, pve.WithHTTPClient(hc))
	} else {
		opts = append(opts, pve.WithTimeout(o.RequestTimeout.D()))
		if o.CAFile != "" {
			opts = append(opts, pve.WithRootCAFile(o.CAFile))
		}
		if o.InsecureSkipVerify {
			opts = append(opts, pve.WithInsecureSkipVerify())
		}
	}
	return &Client{c: pve.NewClient(strings.TrimSuffix(o.Endpoint, "/"), opts...)}, nil
}

func (c *Client) vm(node string, vmid int) *pve.VirtualMachine {
	v := &pve.VirtualMachine{}
	v.New(c.c, node, vmid)
	return v
}

func upid(t *pve.Task) string {
	if t == nil {
		return ""
	}
	return string(t.UPID)
}

// Resources implements API.
func (c *Client) Resources(ctx context.Context) ([]VM, error) {
	var rs pve.ClusterResources
	if err := c.c.Get(ctx, "/cluster/resources?type=vm", &rs); err != nil {
		return nil, fmt.Errorf("GET /cluster/resources: %w", err)
	}
	out := make([]VM, 0, len(rs))
	for _, r := range rs {
		if r == nil || r.Type != "qemu" {
			continue
		}
		out = append(out, VM{VMID: int(r.VMID), Node: r.Node, Name: r.Name, Status: r.Status, Tags: SplitTags(r.Tags),
			Template: r.Template == 1, MaxMem: r.MaxMem})
	}
	return out, nil
}

// Nodes implements API.
func (c *Client) Nodes(ctx context.Context) ([]Node, error) {
	ns, err := c.c.Nodes(ctx)
	if err != nil {
		return nil, fmt.Errorf("GET /nodes: %w", err)
	}
	out := make([]Node, 0, len(ns))
	for _, n := range ns {
		if n == nil {
			continue
		}
		out = append(out, Node{Name: n.Node, Online: n.Status == "online", MaxMem: n.MaxMem, Mem: n.Mem})
	}
	return out, nil
}

// NextID implements API. Proxmox answers the id as a string.
func (c *Client) NextID(ctx context.Context) (int, error) {
	var raw json.RawMessage
	if err := c.c.Get(ctx, "/cluster/nextid", &raw); err != nil {
		return 0, fmt.Errorf("GET /cluster/nextid: %w", err)
	}
	id, err := strconv.Atoi(strings.Trim(string(raw), `"`))
	if err != nil {
		return 0, fmt.Errorf("GET /cluster/nextid: answer %s: %w", raw, err)
	}
	return id, nil
}

// Config implements API.
func (c *Client) Config(ctx context.Context, node string, vmid int) (VMConfig, error) {
	var m map[string]json.RawMessage
	if err := c.c.Get(ctx, fmt.Sprintf("/nodes/%s/qemu/%d/config", node, vmid), &m); err != nil {
		return VMConfig{}, fmt.Errorf("GET config of VM %d on %s: %w", vmid, node, err)
	}
	out := VMConfig{Options: map[string]string{}}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		var s string
		if err := json.Unmarshal(m[k], &s); err != nil {
			s = string(m[k]) // numbers
		}
		switch k {
		case "name":
			out.Name = s
		case "description":
			out.Description = s
		case "tags":
			out.Tags = SplitTags(s)
		default:
			out.Options[k] = s
		}
	}
	return out, nil
}

// Clone implements API.
func (c *Client) Clone(ctx context.Context, node string, vmid int, o CloneOptions) (string, error) {
	p := &pve.VirtualMachineCloneOptions{NewID: o.NewID, Name: o.Name, Description: o.Description, Target: o.Target,
		Full: pve.IntOrBool(o.Full), Storage: o.Storage, Pool: o.Pool}
	_, t, err := c.vm(node, vmid).Clone(ctx, p)
	if err != nil {
		return "", fmt.Errorf("cloning VM %d on %s to %d: %w", vmid, node, o.NewID, err)
	}
	return upid(t), nil
}

// SetConfig implements API.
func (c *Client) SetConfig(ctx context.Context, node string, vmid int, opts ...ConfigOption) (string, error) {
	vo := make([]pve.VirtualMachineOption, len(opts))
	for i, o := range opts {
		vo[i] = pve.VirtualMachineOption{Name: o.Name, Value: o.Value}
	}
	t, err := c.vm(node, vmid).Config(ctx, vo...)
	if err != nil {
		return "", fmt.Errorf("configuring VM %d on %s: %w", vmid, node, err)
	}
	return upid(t), nil
}

// Start implements API.
func (c *Client) Start(ctx context.Context, node string, vmid int) (string, error) {
	t, err := c.vm(node, vmid).Start(ctx)
	if err != nil {
		return "", fmt.Errorf("starting VM %d on %s: %w", vmid, node, err)
	}
	return upid(t), nil
}

// Stop implements API.
func (c *Client) Stop(ctx context.Context, node string, vmid int) (string, error) {
	t, err := c.vm(node, vmid).Stop(ctx)
	if err != nil {
		return "", fmt.Errorf("stopping VM %d on %s: %w", vmid, node, err)
	}
	return upid(t), nil
}

// Destroy implements API: the VM and every disk of it, referenced or not.
func (c *Client) Destroy(ctx context.Context, node string, vmid int) (string, error) {
	t, err := c.vm(node, vmid).Delete(ctx, &pve.VirtualMachineDeleteOptions{DestroyUnreferencedDisks: true})
	if err != nil {
		return "", fmt.Errorf("destroying VM %d on %s: %w", vmid, node, err)
	}
	return upid(t), nil
}

// Upload implements API. go-proxmox's upload takes no context; the
// client's request timeout bounds it.
func (c *Client) Upload(_ context.Context, node, storage, filename string, body []byte) (string, error) {
	var u pve.UPID
	if err := c.c.UploadReader(fmt.Sprintf("/nodes/%s/storage/%s/upload", node, storage), map[string]string{"content": "iso"},
		filename, bytes.NewReader(body), int64(len(body)), &u); err != nil {
		return "", fmt.Errorf("uploading %s to %s on %s: %w", filename, storage, node, err)
	}
	return string(u), nil
}

// DeleteVolume implements API.
func (c *Client) DeleteVolume(ctx context.Context, node, storage, volume string) (string, error) {
	var u pve.UPID
	if err := c.c.Delete(ctx, fmt.Sprintf("/nodes/%s/storage/%s/content/%s", node, storage, volume), &u); err != nil {
		return "", fmt.Errorf("deleting %s on %s: %w", volume, node, err)
	}
	return string(u), nil
}

// TaskStatus implements API.
func (c *Client) TaskStatus(ctx context.Context, u string) (TaskStatus, error) {
	t := pve.NewTask(pve.UPID(u), c.c)
	if t == nil || t.Node == "" {
		return TaskStatus{}, fmt.Errorf("task %q: not a UPID", u)
	}
	if err := t.Ping(ctx); err != nil {
		return TaskStatus{}, fmt.Errorf("GET status of task %s: %w", u, err)
	}
	return TaskStatus{Status: t.Status, ExitStatus: t.ExitStatus}, nil
}
