// Package session runs the agent's connection to the Agent service: one mTLS
// gRPC connection carrying the KeyGenRequests stream (keys generated and
// submitted), the ReceiveFiles stream (files written through the safe writer)
// and the ReportHealth stream (a report every interval and right after each
// delivery). When any stream fails the connection is dropped and rebuilt with
// exponential backoff, which carries the agent across server restarts and
// leader changes. On shutdown a last report with a shutdown notice is sent.
package session
