// Fixture: a local package called ec2 is not the SDK's.
package fixture

import (
	"example.com/fleet/ec2"
	_ "github.com/aws/aws-sdk-go-v2/service/sqs"
)

var _ = ec2.CreateWidgetInput{}
