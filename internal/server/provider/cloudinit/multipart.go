package cloudinit

import (
	"bytes"
	"compress/gzip"
	"encoding/base64"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/nstance-dev/nstance/internal/server/provider"
)

// mimeBoundary separates the parts of a multi-part user data document.
// Neither part can contain it: the agent's script is ours and a user part
// that does is sent base64-encoded (whose alphabet has no '-').
const mimeBoundary = "==nstance-part-boundary-1=="

// Platform is what the composed user data travels through.
type Platform struct {
	// Name names the platform in errors ("EC2", "Proxmox VE").
	Name string
	// MaxBytes is its limit on user data (0: none). Above it the document
	// is gzip-compressed (cloud-init reads gzip user data); still above,
	// it is refused.
	MaxBytes int
}

// userPartType is the cloud-init content type of the user's bootstrap data,
// read off its first line as cloud-init itself does.
func userPartType(data []byte, format, platform string) (string, error) {
	if format == "ignition" {
		return "", fmt.Errorf("ignition bootstrap data cannot travel beside the agent's cloud-init bootstrap on %s; use a cloud-config bootstrap format", platform)
	}
	for _, t := range []struct{ prefix, typ string }{
		{"#cloud-config", "text/cloud-config"},
		{"#!", "text/x-shellscript"},
		{"#cloud-boothook", "text/cloud-boothook"},
		{"#include", "text/x-include-url"},
		{"## template: jinja", "text/jinja2"},
	} {
		if bytes.HasPrefix(data, []byte(t.prefix)) {
			return t.typ, nil
		}
	}
	if bytes.HasPrefix(bytes.ToLower(data), []byte("content-type: multipart/")) {
		return "", fmt.Errorf("the bootstrap data is already a MIME multi-part document; send a single cloud-config or script, the server adds the agent's part")
	}
	return "", fmt.Errorf("the bootstrap data starts with neither #cloud-config nor #! (cloud-init would not know what to do with it)")
}

// Compose is the user data an instance boots with. Without bootstrap data
// of its own it is the agent's script alone. With it, a cloud-init
// multi-part MIME document: the agent's script first (part
// "00-nstance-agent", run before the user's scripts, whose names sort
// after it) and the user's data as its own part, so nothing in the user's
// data can change or skip the agent's bootstrap. A document above the
// platform's limit is gzip-compressed; still too large, it is refused
// naming what the data belongs to.
func Compose(agentScript []byte, req provider.CreateRequest, p Platform) ([]byte, error) {
	if len(req.UserData) == 0 {
		return agentScript, nil
	}
	typ, err := userPartType(req.UserData, req.UserDataFormat, p.Name)
	if err != nil {
		return nil, fmt.Errorf("instance %s: %w", req.InstanceID, err)
	}
	if bytes.Contains(agentScript, []byte(mimeBoundary)) {
		return nil, fmt.Errorf("instance %s: the agent's bootstrap contains the MIME boundary", req.InstanceID)
	}
	var b bytes.Buffer
	b.WriteString("Content-Type: multipart/mixed; boundary=\"" + mimeBoundary + "\"\nMIME-Version: 1.0\n\n")
	part := func(typ, name, encoding string, body []byte) {
		fmt.Fprintf(&b, "--%s\nContent-Type: %s; charset=\"utf-8\"\nMIME-Version: 1.0\nContent-Transfer-Encoding: %s\n"+
			"Content-Disposition: attachment; filename=\"%s\"\n\n", mimeBoundary, typ, encoding, name)
		b.Write(body)
		// The line break before the next boundary belongs to the boundary
		// (RFC 2046): the body keeps its own last newline.
		b.WriteByte('\n')
	}
	part("text/x-shellscript", "00-nstance-agent", "7bit", agentScript)
	if utf8.Valid(req.UserData) && !bytes.Contains(req.UserData, []byte(mimeBoundary)) && !bytes.Contains(req.UserData, []byte("\r")) {
		part(typ, "10-user-data", "8bit", req.UserData)
	} else {
		part(typ, "10-user-data", "base64", wrap76(base64.StdEncoding.EncodeToString(req.UserData)))
	}
	b.WriteString("--" + mimeBoundary + "--\n")
	if p.MaxBytes <= 0 || b.Len() <= p.MaxBytes {
		return b.Bytes(), nil
	}
	var z bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&z, gzip.BestCompression)
	_, _ = zw.Write(b.Bytes())
	if err := zw.Close(); err != nil {
		return nil, fmt.Errorf("compressing user data: %w", err)
	}
	if z.Len() > p.MaxBytes {
		what := "group " + req.GroupID
		if req.GroupID == "" {
			what = "on-demand instance " + req.InstanceID
		}
		return nil, fmt.Errorf("%s: the bootstrap data (%d bytes) with the agent's bootstrap is %d bytes, %d compressed; %s allows %d",
			what, len(req.UserData), b.Len(), z.Len(), p.Name, p.MaxBytes)
	}
	return z.Bytes(), nil
}

func wrap76(s string) []byte {
	var b strings.Builder
	for len(s) > 76 {
		b.WriteString(s[:76] + "\n")
		s = s[76:]
	}
	b.WriteString(s + "\n")
	return []byte(b.String())
}
