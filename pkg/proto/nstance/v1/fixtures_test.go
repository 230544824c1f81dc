package nstancev1_test

import (
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// fixture is a fully populated message used by the round-trip tests.
type fixture struct {
	name string
	msg  proto.Message
}

var baseTime = time.Date(2026, 11, 3, 14, 5, 6, 789000000, time.UTC)

func ts(offset time.Duration) *timestamppb.Timestamp { return timestamppb.New(baseTime.Add(offset)) }

func dur(d time.Duration) *durationpb.Duration { return durationpb.New(d) }

func identity(role nstancev1.ClientRole) *nstancev1.ClientIdentity {
	return &nstancev1.ClientIdentity{
		ClientId:  "i-0a1b2c",
		Tenant:    "acme",
		ClusterId: "cluster-7",
		Shard:     "dev-1",
		Role:      role,
		GroupId:   "web",
		Uri:       "spiffe://cluster-7/tenant/acme/agent/i-0a1b2c",
	}
}

func groupSpec() *nstancev1.GroupSpec {
	return &nstancev1.GroupSpec{
		GroupId:        "web",
		Template:       "k8s-worker",
		Size:           3,
		InstanceType:   "t4g.small",
		SubnetPool:     "private",
		Vars:           map[string]string{"NODE_ROLE": "web", "EMPTY": ""},
		DrainTimeout:   dur(5 * time.Minute),
		Labels:         map[string]string{"team": "edge", "tier": "frontend"},
		UserData:       []byte("#cloud-config\nruncmd: [kubeadm join]\n"),
		UserDataFormat: "cloud-config",
		UserDataSha256: "8f2c0e4d8c1b7e0f8a4b6e7d1c2b3a4f5e6d7c8b9a0f1e2d3c4b5a6978675645",
		Rollout:        &nstancev1.RolloutStrategy{MaxSurge: proto.Uint32(2), MaxUnavailable: 1, Paused: true},
		Image:          "ami-0123456789abcdef0",
	}
}

func groupStatus() *nstancev1.GroupStatus {
	return &nstancev1.GroupStatus{
		Spec:           groupSpec(),
		ActualSize:     2,
		ReadyCount:     1,
		ProviderIds:    []string{"tmux:///dev/deva/i-1", "tmux:///dev/deva/i-2"},
		Static:         true,
		Etag:           `"9a0364b9e99bb480dd25e1f0284c8555"`,
		UpdatedAt:      ts(time.Minute),
		Shard:          "dev-1",
		UserDataSha256: "8f2c0e4d8c1b7e0f8a4b6e7d1c2b3a4f5e6d7c8b9a0f1e2d3c4b5a6978675645",
		UpToDateCount:  1,
	}
}

func instanceStatus() *nstancev1.InstanceStatus {
	return &nstancev1.InstanceStatus{
		InstanceId: "i-0a1b2c",
		GroupId:    "web",
		Shard:      "dev-1",
		ProviderId: "tmux:///dev/deva/i-0a1b2c",
		State:      nstancev1.InstanceState_INSTANCE_STATE_PENDING_DELETION,
		Addresses: []*nstancev1.InstanceAddress{
			{Type: nstancev1.AddressType_ADDRESS_TYPE_INTERNAL_IP, Address: "10.0.1.7"},
			{Type: nstancev1.AddressType_ADDRESS_TYPE_HOSTNAME, Address: "web-1"},
		},
		CreatedAt:      ts(-time.Hour),
		LastHealthAt:   ts(-10 * time.Second),
		InstanceType:   "t4g.small",
		Message:        "waiting for drain",
		Template:       "k8s-worker",
		DrainDeadline:  ts(5 * time.Minute),
		ClientToken:    "machine-uid-42",
		WorkloadGone:   true,
		AgentVersion:   "v0.4.0",
		UserDataSha256: "8f2c0e4d8c1b7e0f8a4b6e7d1c2b3a4f5e6d7c8b9a0f1e2d3c4b5a6978675645",
		FirstHealthAt:  ts(-50 * time.Minute),
		Replaced:       true,
		Drifted:        true,
		LoadBalancers: []*nstancev1.LoadBalancerTarget{{
			Name: "www", State: nstancev1.LoadBalancerTargetState_LOAD_BALANCER_TARGET_STATE_DEREGISTERING,
			RegisteredAt: ts(-40 * time.Minute), DeregisteredAt: ts(-10 * time.Second), LastError: "haproxy: del server: connections remain",
		}},
	}
}

// fixtures lists a fully populated value for every message that has fields.
// TestFixturesCoverEveryField fails when a field or message is added without
// being exercised here.
func fixtures() []fixture {
	return []fixture{
		// common.proto
		{"ClientIdentity", identity(nstancev1.ClientRole_CLIENT_ROLE_OPERATOR)},
		{"ValidationError", &nstancev1.ValidationError{Key: "shard.infra.zone", Reason: "must not be empty"}},

		// registration.proto
		{"RegisterAgentRequest", &nstancev1.RegisterAgentRequest{
			Nonce:        "eyJhbGciOiJFZERTQSJ9.eyJraW5kIjoiYWdlbnQifQ.c2ln",
			PublicKeyPem: "-----BEGIN PUBLIC KEY-----\nMCowBQYDK2VwAyEA\n-----END PUBLIC KEY-----\n",
			IpAddresses:  []string{"10.0.1.7", "fd00::7"},
			Hostname:     "web-1",
		}},
		{"RegisterAgentResponse", &nstancev1.RegisterAgentResponse{
			CertificatePem: "-----BEGIN CERTIFICATE-----\nagent\n-----END CERTIFICATE-----\n",
			CaChainPem:     "-----BEGIN CERTIFICATE-----\nca\n-----END CERTIFICATE-----\n",
			ExpiresAt:      ts(24 * time.Hour),
			Identity:       identity(nstancev1.ClientRole_CLIENT_ROLE_AGENT),
		}},
		{"RegisterOperatorRequest", &nstancev1.RegisterOperatorRequest{
			Nonce:        "eyJhbGciOiJFZERTQSJ9.eyJraW5kIjoib3BlcmF0b3IifQ.c2ln",
			PublicKeyPem: "-----BEGIN PUBLIC KEY-----\nMCowBQYDK2VwAyEB\n-----END PUBLIC KEY-----\n",
			IpAddresses:  []string{"10.0.0.2"},
			Hostname:     "operator-0",
		}},
		{"RegisterOperatorResponse", &nstancev1.RegisterOperatorResponse{
			CertificatePem: "-----BEGIN CERTIFICATE-----\noperator\n-----END CERTIFICATE-----\n",
			CaChainPem:     "-----BEGIN CERTIFICATE-----\nca\n-----END CERTIFICATE-----\n",
			ExpiresAt:      ts(30 * 24 * time.Hour),
			Identity:       identity(nstancev1.ClientRole_CLIENT_ROLE_OPERATOR),
		}},

		// agent.proto
		{"KeyGenRequestsRequest", &nstancev1.KeyGenRequestsRequest{ExistingKeyNames: []string{"kubelet", "ssh-host"}}},
		{"KeyGenRequest", &nstancev1.KeyGenRequest{
			Keys: []*nstancev1.KeySpec{
				{
					Name: "kubelet",
					Type: nstancev1.KeyType_KEY_TYPE_ECDSA_P256,
					Certificate: &nstancev1.CertificateSpec{
						CommonName:          "system:node:web-1",
						Usages:              []nstancev1.CertificateUsage{nstancev1.CertificateUsage_CERTIFICATE_USAGE_CLIENT_AUTH, nstancev1.CertificateUsage_CERTIFICATE_USAGE_SERVER_AUTH},
						DnsNames:            []string{"web-1", "web-1.internal"},
						IpAddresses:         []string{"10.0.1.7"},
						Uris:                []string{"spiffe://cluster-7/tenant/acme/agent/i-0a1b2c"},
						Validity:            dur(72 * time.Hour),
						Ca:                  "kubernetes",
						Organization:        []string{"system:nodes"},
						OrganizationalUnits: []string{"workers"},
					},
				},
				{Name: "ssh-host", Type: nstancev1.KeyType_KEY_TYPE_ED25519},
			},
			ConfigHash: "sha256:4f1c",
			SentAt:     ts(0),
		}},
		{"SubmitPublicKeysRequest", &nstancev1.SubmitPublicKeysRequest{Keys: []*nstancev1.PublicKey{
			{Name: "kubelet", Type: nstancev1.KeyType_KEY_TYPE_ECDSA_P256, PublicKeyPem: "-----BEGIN PUBLIC KEY-----\nMFkw\n-----END PUBLIC KEY-----\n"},
			{Name: "legacy", Type: nstancev1.KeyType_KEY_TYPE_RSA_4096, PublicKeyPem: "-----BEGIN PUBLIC KEY-----\nMIIC\n-----END PUBLIC KEY-----\n"},
		}}},
		{"SubmitPublicKeysResponse", &nstancev1.SubmitPublicKeysResponse{
			Accepted: []string{"kubelet"},
			Rejected: []*nstancev1.RejectedKey{{Name: "legacy", Reason: "no key named legacy in the template"}},
		}},
		{"ReceiveFilesRequest", &nstancev1.ReceiveFilesRequest{ConfigHash: "sha256:0000"}},
		{"FileDelivery", &nstancev1.FileDelivery{
			Files: []*nstancev1.DeliveredFile{
				{Path: "certs/kubelet.crt", Content: []byte("-----BEGIN CERTIFICATE-----\n"), Mode: 0o644, Kind: nstancev1.FileKind_FILE_KIND_CERTIFICATE, Sha256: "aa11"},
				{Path: "env/kubelet.env", Content: []byte{'A', '=', '1', '\n', 0x00, 0xff}, Mode: 0o600, Kind: nstancev1.FileKind_FILE_KIND_ENV, Sha256: "bb22"},
			},
			ConfigHash:   "sha256:4f1c",
			SentAt:       ts(time.Second),
			PendingPaths: []string{"certs/serving.crt"},
		}},
		{"HealthReport", &nstancev1.HealthReport{
			Timestamp: ts(2 * time.Second),
			Uptime:    dur(36*time.Hour + 1500*time.Millisecond),
			Cpu:       &nstancev1.CpuStats{Load1: 0.42, Load5: 0.3, Load15: 0.25, UsagePercent: 12.5, Cores: 2},
			Memory:    &nstancev1.MemoryStats{TotalBytes: 4 << 30, UsedBytes: 1 << 30, AvailableBytes: 3 << 30},
			NetworkInterfaces: []*nstancev1.NetworkInterfaceStats{
				{Name: "eth0", RxBytes: 1 << 40, TxBytes: 12345},
				{Name: "lo", RxBytes: 7, TxBytes: 7},
			},
			Disks: []*nstancev1.DiskStats{{MountPoint: "/", TotalBytes: 20 << 30, UsedBytes: 5 << 30}},
			Files: []*nstancev1.FileStatus{
				{Path: "certs/kubelet.crt", State: nstancev1.FileState_FILE_STATE_OK, Message: "written", Sha256: "aa11"},
				{Path: "env/kubelet.env", State: nstancev1.FileState_FILE_STATE_ERROR, Message: "permission denied", Sha256: "cc33"},
			},
			Termination: &nstancev1.TerminationNotice{
				Kind:     nstancev1.TerminationKind_TERMINATION_KIND_SPOT,
				Deadline: ts(2 * time.Minute),
				Message:  "instance-action: terminate",
			},
			ConfigHash:   "sha256:4f1c",
			AgentVersion: "v0.1.0",
		}},
		{"ReportHealthResponse", &nstancev1.ReportHealthResponse{ReportsReceived: 17, LastReportAt: ts(3 * time.Second)}},

		// group.proto and instance.proto
		{"GroupSpec", groupSpec()},
		{"GroupStatus", groupStatus()},
		{"InstanceStatus", instanceStatus()},

		// operator.proto
		{"GetConfigStatusResponse", &nstancev1.GetConfigStatusResponse{Etag: "d41d8cd98f00b204e9800998ecf8427e", LastModified: ts(-24 * time.Hour), Shard: "dev-1", ServerId: "dev-1-a", LeaderSince: ts(-time.Hour)}},
		{"RefreshConfigResponse", &nstancev1.RefreshConfigResponse{
			Outcome: nstancev1.RefreshConfigOutcome_REFRESH_CONFIG_OUTCOME_INVALID,
			Etag:    "old",
			Message: "config rejected: 2 problems",
			ValidationErrors: []*nstancev1.ValidationError{
				{Key: "groups.acme.web.size", Reason: "must be a non-negative integer"},
				{Key: "templates.k8s-worker.kind", Reason: "unknown kind"},
			},
			PreviousEtag: "old",
		}},
		{"ListGroupsResponse", &nstancev1.ListGroupsResponse{Groups: []*nstancev1.GroupStatus{groupStatus(), {Spec: &nstancev1.GroupSpec{GroupId: "batch", Size: 0}, Etag: "e0"}}}},
		{"UpsertGroupRequest", &nstancev1.UpsertGroupRequest{Group: groupSpec(), ExpectedEtag: "e1"}},
		{"UpsertGroupResponse", &nstancev1.UpsertGroupResponse{Group: groupStatus(), Created: true}},
		{"DeleteGroupRequest", &nstancev1.DeleteGroupRequest{GroupId: "web", ExpectedEtag: "e2"}},
		{"DeleteGroupResponse", &nstancev1.DeleteGroupResponse{GroupId: "web", InstancesToDelete: 3}},
		{"CreateInstanceRequest", &nstancev1.CreateInstanceRequest{
			GroupId:        "web",
			Template:       "k8s-worker",
			InstanceType:   "t4g.medium",
			SubnetPool:     "private",
			Vars:           map[string]string{"NODE_ROLE": "ondemand"},
			Labels:         map[string]string{"machine": "web-ondemand-1"},
			ClientToken:    "machine-uid-42",
			DrainTimeout:   dur(90 * time.Second),
			UserData:       []byte("#!/bin/sh\necho join\n"),
			UserDataFormat: "cloud-config",
			Image:          "ami-0123456789abcdef0",
		}},
		{"CreateInstanceResponse", &nstancev1.CreateInstanceResponse{Instance: instanceStatus()}},
		{"DeleteInstanceRequest", &nstancev1.DeleteInstanceRequest{InstanceId: "i-0a1b2c", SkipDrain: true, OnScaleDown: true}},
		{"DeleteInstanceResponse", &nstancev1.DeleteInstanceResponse{Instance: instanceStatus()}},
		{"DescribeInstanceTypeRequest", &nstancev1.DescribeInstanceTypeRequest{Template: "k8s-worker", InstanceType: "g4dn.xlarge"}},
		{"DescribeInstanceTypeResponse", &nstancev1.DescribeInstanceTypeResponse{InstanceType: &nstancev1.InstanceTypeInfo{
			Name: "g4dn.xlarge", Vcpus: 4, MemoryMib: 16384, Gpus: 1, EphemeralStorageGib: 116, Pods: 110, Architecture: "amd64", OperatingSystem: "linux",
		}}},
		{"GetInstanceStatusRequest/instance_id", &nstancev1.GetInstanceStatusRequest{Lookup: &nstancev1.GetInstanceStatusRequest_InstanceId{InstanceId: "i-0a1b2c"}}},
		{"GetInstanceStatusRequest/client_token", &nstancev1.GetInstanceStatusRequest{Lookup: &nstancev1.GetInstanceStatusRequest_ClientToken{ClientToken: "machine-uid-42"}}},
		{"GetInstanceStatusResponse", &nstancev1.GetInstanceStatusResponse{Instance: instanceStatus()}},
		{"ListInstancesRequest", &nstancev1.ListInstancesRequest{GroupIds: []string{"workers", "gpu"},
			States: []nstancev1.InstanceState{nstancev1.InstanceState_INSTANCE_STATE_RUNNING, nstancev1.InstanceState_INSTANCE_STATE_PENDING_DELETION}}},
		{"ListInstancesResponse", &nstancev1.ListInstancesResponse{Instances: []*nstancev1.InstanceStatus{instanceStatus(), instanceStatus()}}},
		{"AcknowledgeDrainedRequest", &nstancev1.AcknowledgeDrainedRequest{InstanceId: "i-0a1b2c"}},
		{"AcknowledgeDrainedResponse", &nstancev1.AcknowledgeDrainedResponse{Instance: instanceStatus()}},
		{"WatchGroupsRequest", &nstancev1.WatchGroupsRequest{GroupIds: []string{"web", "batch"}}},
		{"GroupEvent", &nstancev1.GroupEvent{
			Type:       nstancev1.GroupEventType_GROUP_EVENT_TYPE_UPSERT,
			GroupId:    "web",
			Group:      groupStatus(),
			Snapshot:   true,
			OccurredAt: ts(4 * time.Second),
			Shard:      "dev-1",
		}},
		{"WatchInstancesRequest", &nstancev1.WatchInstancesRequest{GroupIds: []string{"web"}}},
		{"InstanceEvent", &nstancev1.InstanceEvent{
			Status:        nstancev1.InstanceEventStatus_INSTANCE_EVENT_STATUS_PENDING_DELETION,
			Reason:        nstancev1.DeletionReason_DELETION_REASON_SPOT_TERMINATION,
			InstanceId:    "i-0a1b2c",
			ProviderId:    "tmux:///dev/deva/i-0a1b2c",
			GroupId:       "web",
			DrainDeadline: ts(2 * time.Minute),
			OccurredAt:    ts(5 * time.Second),
			Shard:         "dev-1",
			Message:       "spot interruption notice",
			Replaced:      true,
		}},
		{"WatchErrorsRequest", &nstancev1.WatchErrorsRequest{
			GroupIds: []string{"web"},
			Sources:  []nstancev1.ErrorSource{nstancev1.ErrorSource_ERROR_SOURCE_PROVIDER, nstancev1.ErrorSource_ERROR_SOURCE_RECONCILE},
		}},
		{"ErrorEvent", &nstancev1.ErrorEvent{
			Source:     nstancev1.ErrorSource_ERROR_SOURCE_CONFIG,
			GroupId:    "web",
			InstanceId: "i-0a1b2c",
			Message:    "template k8s-worker: unknown subnet pool",
			OccurredAt: ts(6 * time.Second),
			Shard:      "dev-1",
		}},
		{"RenewCertificateRequest", &nstancev1.RenewCertificateRequest{PublicKeyPem: "-----BEGIN PUBLIC KEY-----\nMCowBQYDK2VwAyEC\n-----END PUBLIC KEY-----\n"}},
		{"RenewCertificateResponse", &nstancev1.RenewCertificateResponse{
			CertificatePem: "-----BEGIN CERTIFICATE-----\nrenewed\n-----END CERTIFICATE-----\n",
			CaChainPem:     "-----BEGIN CERTIFICATE-----\nca\n-----END CERTIFICATE-----\n",
			ExpiresAt:      ts(60 * 24 * time.Hour),
			Identity:       identity(nstancev1.ClientRole_CLIENT_ROLE_OPERATOR),
		}},
		{"ListOperatorsResponse", &nstancev1.ListOperatorsResponse{Operators: []*nstancev1.OperatorRegistration{{
			OperatorId: "op-1", Tenant: "acme", Role: nstancev1.ClientRole_CLIENT_ROLE_ADMIN,
			Uri: "spiffe://cluster-7/tenant/acme/admin/op-1", Serial: "123456789012345678901234567890",
			ExpiresAt: ts(90 * 24 * time.Hour), RegisteredAt: ts(-time.Hour), RegisteredBy: "server-a",
		}}}},
		{"ListRevocationsResponse", &nstancev1.ListRevocationsResponse{Revocations: []*nstancev1.Revocation{revocation()}}},
		{"RevokeRequest", &nstancev1.RevokeRequest{Target: &nstancev1.RevokeRequest_InstanceId{InstanceId: "web-0a1b2c3d"}, Reason: "compromised", Tenant: "acme"}},
		{"RevokeRequestOperator", &nstancev1.RevokeRequest{Target: &nstancev1.RevokeRequest_OperatorId{OperatorId: "op-1"}, Reason: "left", Tenant: "acme"}},
		{"RevokeRequestSerial", &nstancev1.RevokeRequest{Target: &nstancev1.RevokeRequest_Serial{Serial: "42"}, Reason: "key lost", Tenant: "acme"}},
		{"RevokeResponse", &nstancev1.RevokeResponse{Revocation: revocation()}},
	}
}

func revocation() *nstancev1.Revocation {
	return &nstancev1.Revocation{
		Id: "9f86d081884c7d659a2feaa0c55ad015", Kind: nstancev1.RevocationKind_REVOCATION_KIND_AGENT, Subject: "web-0a1b2c3d",
		Shard: "dev-1", Serial: "42", Uri: "spiffe://cluster-7/tenant/acme/agent/web-0a1b2c3d", IssuedBefore: ts(0),
		ExpiresAt: ts(30 * 24 * time.Hour), RevokedAt: ts(time.Second), RevokedBy: "server-a", Reason: "compromised",
		Tenant: "acme",
	}
}
