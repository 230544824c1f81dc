package output

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"sigs.k8s.io/yaml"
)

// Format is an output format.
type Format string

// The output formats.
const (
	Table Format = "table"
	JSON  Format = "json"
	YAML  Format = "yaml"
)

// Formats lists the valid formats in the order help texts show them.
var Formats = []Format{Table, JSON, YAML}

func formatNames() string {
	names := make([]string, len(Formats))
	for i, f := range Formats {
		names[i] = string(f)
	}
	return strings.Join(names, ", ")
}

// Parse checks an -o value.
func Parse(s string) (Format, error) {
	for _, f := range Formats {
		if s == string(f) {
			return f, nil
		}
	}
	return "", fmt.Errorf("unknown output format %q: want one of %s", s, formatNames())
}

// FlagName is the long name of the output flag.
const FlagName = "output"

// Flag is -o/--output. Its value is checked after parsing, before the
// command does anything.
func Flag() cli.Flag {
	return &cli.StringFlag{
		Name: FlagName, Aliases: []string{"o"}, Value: string(Table), Usage: "output format: " + formatNames(),
		Action: func(_ *cli.Context, v string) error {
			_, err := Parse(v)
			return err
		},
	}
}

// New returns a printer for the command's -o value and stdout.
func New(c *cli.Context) (*Printer, error) {
	f, err := Parse(c.String(FlagName))
	if err != nil {
		return nil, err
	}
	return &Printer{W: c.App.Writer, Format: f, Now: time.Now}, nil
}

// Printer writes results to W in Format.
type Printer struct {
	W      io.Writer
	Format Format
	// Now is the clock for relative times (AGE columns).
	Now func() time.Time
}

// Machine reports whether the format is JSON or YAML.
func (p *Printer) Machine() bool { return p.Format != Table }

// Object is a JSON-shaped value: a map, a slice, a string, a json.Number...
type Object = any

// Proto converts a message into an Object with protojson (proto field names,
// every field present), then sets the extra keys (for example "shard").
func Proto(m proto.Message, extra map[string]any) (map[string]any, error) {
	b, err := protojson.MarshalOptions{UseProtoNames: true, EmitUnpopulated: true}.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("encoding %s: %w", m.ProtoReflect().Descriptor().FullName(), err)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var out map[string]any
	if err := dec.Decode(&out); err != nil {
		return nil, fmt.Errorf("re-reading %s: %w", m.ProtoReflect().Descriptor().FullName(), err)
	}
	for k, v := range extra {
		out[k] = v
	}
	return out, nil
}

// ShardProto is Proto with "shard" set to the shard the message came from.
func ShardProto(shard string, m proto.Message) (map[string]any, error) {
	return Proto(m, map[string]any{"shard": shard})
}

// List is the document of a command that may return several results.
type List struct {
	Items []Object `json:"items"`
}

func encodeJSON(v any, indent bool) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if indent {
		enc.SetIndent("", "  ")
	}
	if err := enc.Encode(v); err != nil {
		return nil, fmt.Errorf("encoding output: %w", err)
	}
	return buf.Bytes(), nil
}

// Document writes v as one JSON (indented) or YAML document. It must not be
// called for the table format.
func (p *Printer) Document(v any) error {
	b, err := p.render(v, true)
	if err != nil {
		return err
	}
	_, err = p.W.Write(b)
	return err
}

func (p *Printer) render(v any, indent bool) ([]byte, error) {
	j, err := encodeJSON(v, indent)
	if err != nil {
		return nil, err
	}
	switch p.Format {
	case JSON:
		return j, nil
	case YAML:
		y, err := yaml.JSONToYAML(j)
		if err != nil {
			return nil, fmt.Errorf("encoding output as YAML: %w", err)
		}
		return y, nil
	}
	return nil, fmt.Errorf("output format %q has no document form", p.Format)
}

// Rows is a table: a header and rows of cells.
type Rows struct {
	Header []string
	Rows   [][]string
}

// Add appends a row.
func (r *Rows) Add(cells ...string) { r.Rows = append(r.Rows, cells) }

// Table writes rows as aligned columns.
func (p *Printer) Table(r Rows) error {
	tw := tabwriter.NewWriter(p.W, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, strings.Join(r.Header, "\t"))
	for _, row := range r.Rows {
		fmt.Fprintln(tw, strings.Join(row, "\t"))
	}
	return tw.Flush()
}

// Fields writes "key: value" lines, the table form of a single object.
func (p *Printer) Fields(kv ...string) error {
	var b strings.Builder
	for i := 0; i+1 < len(kv); i += 2 {
		fmt.Fprintf(&b, "%s: %s\n", kv[i], kv[i+1])
	}
	_, err := io.WriteString(p.W, b.String())
	return err
}

// Age renders the time since t like kubectl: 45s, 3m, 5h, 2d; "-" when t is zero.
func (p *Printer) Age(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	d := p.Now().Sub(t)
	switch {
	case d < 0:
		return "0s"
	case d < 2*time.Minute:
		return fmt.Sprintf("%ds", int(d/time.Second))
	case d < 2*time.Hour:
		return fmt.Sprintf("%dm", int(d/time.Minute))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh", int(d/time.Hour))
	}
	return fmt.Sprintf("%dd", int(d/(24*time.Hour)))
}
