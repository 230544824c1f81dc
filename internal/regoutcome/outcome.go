package regoutcome

import (
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Outcome is what a registering client does about an error.
type Outcome int

// Outcomes of Classify.
const (
	// Transient: retry with backoff (server unreachable or busy, storage
	// trouble, a lost reply: registering the same key again is answered
	// with the certificate issued first).
	Transient Outcome = iota
	// NotYetValid: the nonce is not valid yet (the clocks disagree); retry,
	// but only within the clock-skew allowance.
	NotYetValid
	// Definite: the server refused for good; retrying cannot help.
	Definite
)

// String names the outcome for logs.
func (o Outcome) String() string {
	switch o {
	case Transient:
		return "transient"
	case NotYetValid:
		return "not-yet-valid"
	case Definite:
		return "definite"
	}
	return "unknown"
}

// Classify maps a registration error to its Outcome, following the codes
// the Registration service documents.
func Classify(err error) Outcome {
	switch status.Code(err) {
	case codes.FailedPrecondition:
		return NotYetValid
	case codes.InvalidArgument, codes.Unauthenticated, codes.PermissionDenied, codes.AlreadyExists,
		codes.NotFound, codes.Unimplemented, codes.OutOfRange:
		return Definite
	}
	return Transient
}
