// Fixture for TestAWSCallScannerFixture: parsed, never compiled.
package fixture

import (
	"context"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	ec2types "github.com/aws/aws-sdk-go-v2/service/ec2/types"
	awss3 "github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/secretsmanager"
	"github.com/aws/aws-sdk-go-v2/service/ssm"
)

// EC2API is the part of the EC2 client the code uses.
type EC2API interface {
	AttachNetworkInterface(ctx context.Context, in *ec2.AttachNetworkInterfaceInput, opts ...func(*ec2.Options)) (*ec2.AttachNetworkInterfaceOutput, error)
}

func launch(ctx context.Context, c *ec2.Client) (*ec2.RunInstancesOutput, error) {
	return c.RunInstances(ctx, &ec2.RunInstancesInput{
		InstanceType: ec2types.InstanceTypeT3Micro,
		MinCount:     aws.Int32(1),
		MaxCount:     aws.Int32(1),
	})
}

func list(ctx context.Context, c *ec2.Client) error {
	p := ec2.NewDescribeInstancesPaginator(c, &ec2.DescribeInstancesInput{})
	_ = ec2types.NotAnOperationInput{}
	for p.HasMorePages() {
		if _, err := p.NextPage(ctx); err != nil {
			return err
		}
	}
	return nil
}

func detach(ctx context.Context, c *ec2.Client) error {
	in := new(ec2.DetachNetworkInterfaceInput)
	_, err := c.DetachNetworkInterface(ctx, in)
	return err
}

func terminate(ctx context.Context, c *ec2.Client) error {
	var in ec2.TerminateInstancesInput
	_, err := c.TerminateInstances(ctx, &in)
	return err
}

func objects(ctx context.Context, c *awss3.Client) error {
	_ = awss3.NewListObjectsV2Paginator(c, nil)
	_, err := c.PutObject(ctx, &awss3.PutObjectInput{Bucket: aws.String("b")})
	return err
}

func secrets(ctx context.Context, sm *secretsmanager.Client, p *ssm.Client) {
	_, _ = sm.GetSecretValue(ctx, &secretsmanager.GetSecretValueInput{SecretId: aws.String("s")})
	_, _ = p.GetParameter(ctx, &ssm.GetParameterInput{Name: aws.String("p"), WithDecryption: aws.Bool(true)})
}
