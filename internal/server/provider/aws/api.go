package aws

import (
	"context"
	"errors"
	"reflect"
	"sort"

	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/smithy-go"
)

// EC2API is every EC2 call this package makes; *ec2.Client implements it.
// Each method name is an EC2 action, so the IAM policy the server needs is
// IAMActions.
type EC2API interface {
	RunInstances(ctx context.Context, in *ec2.RunInstancesInput, opts ...func(*ec2.Options)) (*ec2.RunInstancesOutput, error)
	DescribeInstances(ctx context.Context, in *ec2.DescribeInstancesInput, opts ...func(*ec2.Options)) (*ec2.DescribeInstancesOutput, error)
	TerminateInstances(ctx context.Context, in *ec2.TerminateInstancesInput, opts ...func(*ec2.Options)) (*ec2.TerminateInstancesOutput, error)
	DescribeNetworkInterfaces(ctx context.Context, in *ec2.DescribeNetworkInterfacesInput, opts ...func(*ec2.Options)) (*ec2.DescribeNetworkInterfacesOutput, error)
	AttachNetworkInterface(ctx context.Context, in *ec2.AttachNetworkInterfaceInput, opts ...func(*ec2.Options)) (*ec2.AttachNetworkInterfaceOutput, error)
	DetachNetworkInterface(ctx context.Context, in *ec2.DetachNetworkInterfaceInput, opts ...func(*ec2.Options)) (*ec2.DetachNetworkInterfaceOutput, error)
	DescribeInstanceTypes(ctx context.Context, in *ec2.DescribeInstanceTypesInput, opts ...func(*ec2.Options)) (*ec2.DescribeInstanceTypesOutput, error)
	DescribeImages(ctx context.Context, in *ec2.DescribeImagesInput, opts ...func(*ec2.Options)) (*ec2.DescribeImagesOutput, error)
	DescribeSubnets(ctx context.Context, in *ec2.DescribeSubnetsInput, opts ...func(*ec2.Options)) (*ec2.DescribeSubnetsOutput, error)
}

var _ EC2API = (*ec2.Client)(nil)

// IAMActions returns the IAM actions of every EC2API method ("ec2:RunInstances"
// and so on), sorted: what the server's IAM policy must allow.
func IAMActions() []string {
	t := reflect.TypeOf((*EC2API)(nil)).Elem()
	out := make([]string, 0, t.NumMethod())
	for i := 0; i < t.NumMethod(); i++ {
		out = append(out, "ec2:"+t.Method(i).Name)
	}
	sort.Strings(out)
	return out
}

// EC2 error codes the provider reacts to.
const (
	codeInstanceNotFound = "InvalidInstanceID.NotFound"
	codeENINotFound      = "InvalidNetworkInterfaceID.NotFound"
	codeAttachNotFound   = "InvalidAttachmentID.NotFound"
)

// errorCode is the EC2 error code of err ("" if it has none).
func errorCode(err error) string {
	var ae smithy.APIError
	if errors.As(err, &ae) {
		return ae.ErrorCode()
	}
	return ""
}

// throttled reports the codes EC2 uses for request throttling.
func throttled(err error) bool {
	switch errorCode(err) {
	case "RequestLimitExceeded", "Throttling", "ThrottlingException":
		return true
	}
	return false
}
