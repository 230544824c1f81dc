package aws

import (
	"context"
	"errors"
	"fmt"
	"strings"

	awssdk "github.com/aws/aws-sdk-go-v2/aws"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/feature/ec2/imds"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/nstance-dev/nstance/internal/server/leaderaddr"
)

// DefaultDeviceIndex is where the shard's ENI is attached (0 is the
// instance's primary interface).
const DefaultDeviceIndex = 1

// ENI holds a shard's fixed network interface for its leader: the address
// agents and operators dial follows whichever server leads. Acquire and
// Release are safe to call again after an error.
type ENI struct {
	API EC2API
	// NetworkInterfaceID is the shard's ENI (eni-…).
	NetworkInterfaceID string
	// InstanceID is this server's EC2 instance (i-…).
	InstanceID string
	// DeviceIndex is where the ENI attaches (0: DefaultDeviceIndex).
	DeviceIndex int32
	// Backoff paces the looks while an attachment settles; the context
	// bounds the whole wait (zero: 200ms doubling up to 5s).
	Backoff wait.Backoff
	Log     logr.Logger
}

// poll runs cond with e's backoff until it is done, fails or ctx ends;
// once the backoff reaches its cap it keeps polling at the cap.
func (e *ENI) poll(ctx context.Context, cond wait.ConditionWithContextFunc) error {
	return leaderaddr.Settle(ctx, e.Backoff, cond)
}

func (e *ENI) describe(ctx context.Context) (types.NetworkInterface, error) {
	out, err := e.API.DescribeNetworkInterfaces(ctx, &ec2.DescribeNetworkInterfacesInput{NetworkInterfaceIds: []string{e.NetworkInterfaceID}})
	if err != nil {
		return types.NetworkInterface{}, fmt.Errorf("DescribeNetworkInterfaces %s: %w", e.NetworkInterfaceID, err)
	}
	if len(out.NetworkInterfaces) != 1 {
		return types.NetworkInterface{}, fmt.Errorf("DescribeNetworkInterfaces %s: want 1 interface, got %d", e.NetworkInterfaceID, len(out.NetworkInterfaces))
	}
	return out.NetworkInterfaces[0], nil
}

// fatal reports errors no wait can cure: the ENI or this instance does
// not exist, or they cannot be paired (configuration errors).
func fatal(err error) bool {
	switch errorCode(err) {
	case codeENINotFound, codeInstanceNotFound,
		"InvalidParameterCombination": // e.g. the ENI is in another zone than the instance
		return true
	}
	return false
}

// Acquire makes this instance hold the ENI: an attachment to another
// instance (a previous leader, alive or not) is force-detached, then the
// ENI is attached here and Acquire returns once EC2 reports it attached.
// Transient errors (throttling, the interface still in use by the previous
// holder, a racing attach) are retried until ctx ends.
func (e *ENI) Acquire(ctx context.Context) error {
	idx := e.DeviceIndex
	if idx == 0 {
		idx = DefaultDeviceIndex
	}
	var last error
	err := e.poll(ctx, func(ctx context.Context) (bool, error) {
		ni, err := e.describe(ctx)
		if err != nil {
			if fatal(err) {
				return false, err
			}
			last = err
			return false, nil
		}
		a := ni.Attachment
		switch {
		case a == nil || a.Status == types.AttachmentStatusDetached:
			_, err := e.API.AttachNetworkInterface(ctx, &ec2.AttachNetworkInterfaceInput{
				NetworkInterfaceId: awssdk.String(e.NetworkInterfaceID), InstanceId: awssdk.String(e.InstanceID), DeviceIndex: awssdk.Int32(idx)})
			if err != nil {
				if fatal(err) {
					return false, fmt.Errorf("AttachNetworkInterface %s to %s: %w", e.NetworkInterfaceID, e.InstanceID, err)
				}
				last = fmt.Errorf("AttachNetworkInterface: %w", err)
				return false, nil
			}
			e.Log.Info("attaching the shard's network interface", "eni", e.NetworkInterfaceID, "instance", e.InstanceID)
			return false, nil // done once a look sees it attached
		case awssdk.ToString(a.InstanceId) == e.InstanceID:
			if a.Status == types.AttachmentStatusAttached {
				return true, nil
			}
			last = fmt.Errorf("attachment %s is %s", awssdk.ToString(a.AttachmentId), a.Status)
			return false, nil // attaching, or our own earlier release still detaching
		default:
			_, err := e.API.DetachNetworkInterface(ctx, &ec2.DetachNetworkInterfaceInput{AttachmentId: a.AttachmentId, Force: awssdk.Bool(true)})
			if err != nil && errorCode(err) != codeAttachNotFound {
				last = fmt.Errorf("DetachNetworkInterface %s from %s: %w", awssdk.ToString(a.AttachmentId), awssdk.ToString(a.InstanceId), err)
				return false, nil
			}
			e.Log.Info("force-detaching the shard's network interface from the previous holder", "eni", e.NetworkInterfaceID,
				"holder", awssdk.ToString(a.InstanceId), "status", a.Status)
			return false, nil
		}
	})
	if err != nil {
		if last != nil && !fatal(err) {
			return fmt.Errorf("acquiring %s for %s: %w (last: %v)", e.NetworkInterfaceID, e.InstanceID, err, last)
		}
		return fmt.Errorf("acquiring %s for %s: %w", e.NetworkInterfaceID, e.InstanceID, err)
	}
	return nil
}

// Release detaches the ENI from this instance (if it holds it) and waits,
// until ctx ends, for the detachment to finish. An ENI attached elsewhere
// is left alone: a newer leader holds it.
func (e *ENI) Release(ctx context.Context) error {
	var last error
	detached := false
	err := e.poll(ctx, func(ctx context.Context) (bool, error) {
		ni, err := e.describe(ctx)
		if err != nil {
			if fatal(err) {
				return false, err
			}
			last = err
			return false, nil
		}
		a := ni.Attachment
		if a == nil || a.Status == types.AttachmentStatusDetached || awssdk.ToString(a.InstanceId) != e.InstanceID {
			return true, nil
		}
		if a.Status == types.AttachmentStatusDetaching && detached {
			return false, nil
		}
		_, err = e.API.DetachNetworkInterface(ctx, &ec2.DetachNetworkInterfaceInput{AttachmentId: a.AttachmentId})
		if err != nil && errorCode(err) != codeAttachNotFound {
			last = fmt.Errorf("DetachNetworkInterface %s: %w", awssdk.ToString(a.AttachmentId), err)
			return false, nil
		}
		detached = true
		e.Log.Info("released the shard's network interface", "eni", e.NetworkInterfaceID, "instance", e.InstanceID)
		return false, nil
	})
	if err != nil {
		if last != nil && !errors.Is(err, context.Canceled) {
			return fmt.Errorf("releasing %s from %s: %w (last: %v)", e.NetworkInterfaceID, e.InstanceID, err, last)
		}
		return fmt.Errorf("releasing %s from %s: %w", e.NetworkInterfaceID, e.InstanceID, err)
	}
	return nil
}

// ENIConfig describes the ENI holder of this server (shard.leader_address
// in mode aws-eni).
type ENIConfig struct {
	// NetworkInterfaceID is the shard's ENI; DeviceIndex where it attaches
	// (0: DefaultDeviceIndex).
	NetworkInterfaceID string
	DeviceIndex        int32
	// Region of the EC2 client; empty: this instance's, from the instance
	// metadata service.
	Region string
	// InstanceID of this server; empty: from the instance metadata service.
	InstanceID string
	// Options tune the EC2 client (endpoint, retries); nil: DefaultOptions.
	Options *Options
	// IMDS is the metadata client; nil: the SDK's default (IMDSv2).
	IMDS *imds.Client
	Log  logr.Logger
}

// NewENI returns the ENI holder for this server: the instance id and region
// come from the instance metadata service unless given, the EC2 client from
// the default credential chain (the instance profile); extra load options
// are applied last (tests: static credentials).
func NewENI(ctx context.Context, c ENIConfig, extra ...func(*awsconfig.LoadOptions) error) (*ENI, error) {
	if c.NetworkInterfaceID == "" {
		return nil, fmt.Errorf("aws ENI: no network interface id")
	}
	md := c.IMDS
	if md == nil && (c.Region == "" || c.InstanceID == "") {
		md = imds.New(imds.Options{EnableFallback: awssdk.FalseTernary}) // IMDSv2 only
	}
	if c.InstanceID == "" || c.Region == "" {
		doc, err := md.GetInstanceIdentityDocument(ctx, &imds.GetInstanceIdentityDocumentInput{})
		if err != nil {
			return nil, fmt.Errorf("aws ENI: this instance's identity document from the metadata service: %w", err)
		}
		if c.InstanceID == "" {
			c.InstanceID = doc.InstanceID
		}
		if c.Region == "" {
			c.Region = doc.Region
		}
	}
	if !strings.HasPrefix(c.InstanceID, "i-") {
		return nil, fmt.Errorf("aws ENI: instance id %q is not i-…", c.InstanceID)
	}
	o := c.Options
	if o == nil {
		o = DefaultOptions()
	}
	client, err := NewClient(ctx, *o, c.Region, extra...)
	if err != nil {
		return nil, err
	}
	return &ENI{API: client, NetworkInterfaceID: c.NetworkInterfaceID, InstanceID: c.InstanceID, DeviceIndex: c.DeviceIndex, Log: c.Log}, nil
}
