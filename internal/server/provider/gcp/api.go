package gcp

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"sort"

	compute "cloud.google.com/go/compute/apiv1"
	"cloud.google.com/go/compute/apiv1/computepb"
	"github.com/googleapis/gax-go/v2/apierror"
	"google.golang.org/api/googleapi"
	"google.golang.org/api/iterator"
	"google.golang.org/api/option"
)

// API is every Compute Engine call this package (and the gcp load
// balancer kind) makes. Mutations return once their zone operation is
// done. *Client implements it on the real REST clients; the fake
// sub-package is a stateful in-process Compute Engine. Each method is one
// REST method (RESTMethods) and needs the IAM permissions of Permissions.
type API interface {
	InsertInstance(ctx context.Context, req *computepb.InsertInstanceRequest) error
	GetInstance(ctx context.Context, req *computepb.GetInstanceRequest) (*computepb.Instance, error)
	ListInstances(ctx context.Context, req *computepb.ListInstancesRequest) ([]*computepb.Instance, error)
	DeleteInstance(ctx context.Context, req *computepb.DeleteInstanceRequest) error
	UpdateNetworkInterface(ctx context.Context, req *computepb.UpdateNetworkInterfaceInstanceRequest) error
	GetAddress(ctx context.Context, req *computepb.GetAddressRequest) (*computepb.Address, error)
	AddInstances(ctx context.Context, req *computepb.AddInstancesInstanceGroupRequest) error
	RemoveInstances(ctx context.Context, req *computepb.RemoveInstancesInstanceGroupRequest) error
	ListGroupInstances(ctx context.Context, req *computepb.ListInstancesInstanceGroupsRequest) ([]*computepb.InstanceWithNamedPorts, error)
}

// opGet is the permission every mutation needs to wait for its zone
// operation (zoneOperations.get).
const opGet = "compute.zoneOperations.get"

// RESTMethods maps each API method to the Compute Engine REST method it
// calls ("instances.insert"); mutations also call zoneOperations.get.
var RESTMethods = map[string]string{
	"InsertInstance":         "instances.insert",
	"GetInstance":            "instances.get",
	"ListInstances":          "instances.list",
	"DeleteInstance":         "instances.delete",
	"UpdateNetworkInterface": "instances.updateNetworkInterface",
	"GetAddress":             "addresses.get",
	"AddInstances":           "instanceGroups.addInstances",
	"RemoveInstances":        "instanceGroups.removeInstances",
	"ListGroupInstances":     "instanceGroups.listInstances",
}

// Permissions maps each REST method (and zoneOperations.get) to the IAM
// permissions it needs, as the Compute Engine IAM reference lists them.
// instances.insert needs the permissions of what the request carries:
// metadata, labels, network tags, a service account (iam.serviceAccounts.actAs
// on it), a boot disk from an image or an instance template, a subnetwork.
var Permissions = map[string][]string{
	"instances.insert": {"compute.instances.create", "compute.instances.setMetadata", "compute.instances.setLabels",
		"compute.instances.setTags", "compute.instances.setServiceAccount", "iam.serviceAccounts.actAs",
		"compute.disks.create", "compute.disks.setLabels", "compute.images.useReadOnly", "compute.instanceTemplates.useReadOnly",
		"compute.subnetworks.use", opGet},
	"instances.get":                    {"compute.instances.get"},
	"instances.list":                   {"compute.instances.list"},
	"instances.delete":                 {"compute.instances.delete", opGet},
	"instances.updateNetworkInterface": {"compute.instances.updateNetworkInterface", "compute.subnetworks.use", "compute.addresses.useInternal", opGet},
	"addresses.get":                    {"compute.addresses.get"},
	"instanceGroups.addInstances":      {"compute.instanceGroups.update", "compute.instances.use", opGet},
	"instanceGroups.removeInstances":   {"compute.instanceGroups.update", "compute.instances.use", opGet},
	"instanceGroups.listInstances":     {"compute.instanceGroups.get"},
	"zoneOperations.get":               {opGet},
}

// APIMethods returns the method names of API, sorted.
func APIMethods() []string {
	t := reflect.TypeOf((*API)(nil)).Elem()
	out := make([]string, 0, t.NumMethod())
	for i := 0; i < t.NumMethod(); i++ {
		out = append(out, t.Method(i).Name)
	}
	sort.Strings(out)
	return out
}

// IAMPermissions returns every permission the API's calls need, sorted
// and without duplicates: the includedPermissions of the server's custom
// role (deploy/gcp).
func IAMPermissions() []string {
	set := map[string]bool{}
	for _, m := range APIMethods() {
		for _, p := range Permissions[RESTMethods[m]] {
			set[p] = true
		}
	}
	for _, p := range Permissions["zoneOperations.get"] {
		set[p] = true
	}
	out := make([]string, 0, len(set))
	for p := range set {
		out = append(out, p)
	}
	sort.Strings(out)
	return out
}

// Client implements API on the Compute Engine REST clients.
type Client struct {
	Instances      *compute.InstancesClient
	Addresses      *compute.AddressesClient
	InstanceGroups *compute.InstanceGroupsClient
}

var _ API = (*Client)(nil)

// NewClient returns the REST clients with opts (credentials from the
// environment, i.e. the instance's service account, unless opts say
// otherwise; tests: option.WithEndpoint and option.WithoutAuthentication).
func NewClient(ctx context.Context, opts ...option.ClientOption) (*Client, error) {
	inst, err := compute.NewInstancesRESTClient(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("compute instances client: %w", err)
	}
	addr, err := compute.NewAddressesRESTClient(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("compute addresses client: %w", err)
	}
	igs, err := compute.NewInstanceGroupsRESTClient(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("compute instance groups client: %w", err)
	}
	return &Client{Instances: inst, Addresses: addr, InstanceGroups: igs}, nil
}

// Close closes the clients.
func (c *Client) Close() error {
	return errors.Join(c.Instances.Close(), c.Addresses.Close(), c.InstanceGroups.Close())
}

func waitOp(ctx context.Context, op *compute.Operation, err error) error {
	if err != nil {
		return err
	}
	if err := op.Wait(ctx); err != nil {
		return fmt.Errorf("operation %s: %w", op.Name(), err)
	}
	return nil
}

// InsertInstance implements API.
func (c *Client) InsertInstance(ctx context.Context, req *computepb.InsertInstanceRequest) error {
	op, err := c.Instances.Insert(ctx, req)
	return waitOp(ctx, op, err)
}

// GetInstance implements API.
func (c *Client) GetInstance(ctx context.Context, req *computepb.GetInstanceRequest) (*computepb.Instance, error) {
	return c.Instances.Get(ctx, req)
}

// ListInstances implements API: every page.
func (c *Client) ListInstances(ctx context.Context, req *computepb.ListInstancesRequest) ([]*computepb.Instance, error) {
	return allPages(c.Instances.List(ctx, req))
}

// DeleteInstance implements API.
func (c *Client) DeleteInstance(ctx context.Context, req *computepb.DeleteInstanceRequest) error {
	op, err := c.Instances.Delete(ctx, req)
	return waitOp(ctx, op, err)
}

// UpdateNetworkInterface implements API.
func (c *Client) UpdateNetworkInterface(ctx context.Context, req *computepb.UpdateNetworkInterfaceInstanceRequest) error {
	op, err := c.Instances.UpdateNetworkInterface(ctx, req)
	return waitOp(ctx, op, err)
}

// GetAddress implements API.
func (c *Client) GetAddress(ctx context.Context, req *computepb.GetAddressRequest) (*computepb.Address, error) {
	return c.Addresses.Get(ctx, req)
}

// AddInstances implements API.
func (c *Client) AddInstances(ctx context.Context, req *computepb.AddInstancesInstanceGroupRequest) error {
	op, err := c.InstanceGroups.AddInstances(ctx, req)
	return waitOp(ctx, op, err)
}

// RemoveInstances implements API.
func (c *Client) RemoveInstances(ctx context.Context, req *computepb.RemoveInstancesInstanceGroupRequest) error {
	op, err := c.InstanceGroups.RemoveInstances(ctx, req)
	return waitOp(ctx, op, err)
}

// ListGroupInstances implements API: every page.
func (c *Client) ListGroupInstances(ctx context.Context, req *computepb.ListInstancesInstanceGroupsRequest) ([]*computepb.InstanceWithNamedPorts, error) {
	return allPages(c.InstanceGroups.ListInstances(ctx, req))
}

// allPages drains a list iterator of the compute client.
func allPages[T any](it interface{ Next() (T, error) }) ([]T, error) {
	var out []T
	for {
		v, err := it.Next()
		if errors.Is(err, iterator.Done) {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
}

// HTTPCode is the HTTP status of a Compute Engine error (0 if it has none).
func HTTPCode(err error) int {
	var ae *apierror.APIError
	if errors.As(err, &ae) && ae.HTTPCode() > 0 {
		return ae.HTTPCode()
	}
	var ge *googleapi.Error
	if errors.As(err, &ge) {
		return ge.Code
	}
	return 0
}

// NotFound reports a 404 from Compute Engine.
func NotFound(err error) bool { return HTTPCode(err) == http.StatusNotFound }

// AlreadyExists reports a 409 from Compute Engine (a create of a name
// that exists).
func AlreadyExists(err error) bool { return HTTPCode(err) == http.StatusConflict }

// NewError returns the error the REST client returns for an HTTP status:
// the fake's errors, so HTTPCode works on both.
func NewError(code int, msg string) error {
	return &googleapi.Error{Code: code, Message: msg}
}
