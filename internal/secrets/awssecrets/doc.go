// Package awssecrets reads encryption keys from AWS Secrets Manager
// (GetSecretValue; a binary secret is the raw key, a string secret its hex
// or base64 text; VersionStage/VersionID pick a version, so the previous key
// of a rotation is AWSPREVIOUS) and from SSM Parameter Store (GetParameter
// with decryption; "name:version" picks a version). It implements
// secrets.Remote behind the small SecretsManagerAPI and SSMAPI interfaces
// the aws-sdk-go-v2 clients satisfy.
package awssecrets
