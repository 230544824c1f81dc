package output_test

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/nstance-dev/nstance/internal/admin/output"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

var now = time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)

func printer(f output.Format) (*output.Printer, *bytes.Buffer) {
	var buf bytes.Buffer
	return &output.Printer{W: &buf, Format: f, Now: func() time.Time { return now }}, &buf
}

func group() *nstancev1.GroupStatus {
	return &nstancev1.GroupStatus{
		Spec:       &nstancev1.GroupSpec{GroupId: "db", Template: "worker", Size: 2, Vars: map[string]string{"role": "db", "a<b": "x&y"}},
		ActualSize: 2, ReadyCount: 1, ProviderIds: []string{"p-1", "p-2"}, Etag: "e1",
		UpdatedAt: timestamppb.New(now.Add(-time.Minute)),
	}
}

func TestParse(t *testing.T) {
	for _, f := range []string{"table", "json", "yaml"} {
		got, err := output.Parse(f)
		require.NoError(t, err)
		require.Equal(t, output.Format(f), got)
	}
	for _, bad := range []string{"", "bogus", "JSON", "-", "yml"} {
		_, err := output.Parse(bad)
		require.EqualError(t, err, `unknown output format "`+bad+`": want one of table, json, yaml`)
	}
}

func TestTableAndFields(t *testing.T) {
	p, buf := printer(output.Table)
	rows := output.Rows{Header: []string{"SHARD", "GROUP", "SIZE"}}
	rows.Add("dev-1", "db", "2")
	rows.Add("dev-10", "workers", "12")
	require.NoError(t, p.Table(rows))
	require.Equal(t, ""+
		"SHARD   GROUP    SIZE\n"+
		"dev-1   db       2\n"+
		"dev-10  workers  12\n", buf.String())

	buf.Reset()
	require.NoError(t, p.Fields("group", "db", "size", "2"))
	require.Equal(t, "group: db\nsize: 2\n", buf.String())
}

// The machine formats are byte-stable: protojson's deliberately unstable
// spacing is normalised, keys are sorted, every field is present.
func TestDocumentJSONAndYAML(t *testing.T) {
	obj, err := output.ShardProto("dev-1", group())
	require.NoError(t, err)

	p, buf := printer(output.JSON)
	require.NoError(t, p.Document(output.List{Items: []output.Object{obj}}))
	want := `{
  "items": [
    {
      "actual_size": 2,
      "etag": "e1",
      "provider_ids": [
        "p-1",
        "p-2"
      ],
      "ready_count": 1,
      "shard": "dev-1",
      "spec": {
        "drain_timeout": null,
        "group_id": "db",
        "image": "",
        "instance_type": "",
        "labels": {},
        "rollout": null,
        "size": 2,
        "subnet_pool": "",
        "template": "worker",
        "user_data": "",
        "user_data_format": "",
        "user_data_sha256": "",
        "vars": {
          "a<b": "x&y",
          "role": "db"
        }
      },
      "static": false,
      "up_to_date_count": 0,
      "updated_at": "2026-05-01T11:59:00Z",
      "user_data_sha256": ""
    }
  ]
}
`
	require.Equal(t, want, buf.String())
	for range 20 { // protojson randomises whitespace between runs; the output must not change
		buf2 := &bytes.Buffer{}
		p2 := &output.Printer{W: buf2, Format: output.JSON, Now: p.Now}
		o2, err := output.ShardProto("dev-1", group())
		require.NoError(t, err)
		require.NoError(t, p2.Document(output.List{Items: []output.Object{o2}}))
		require.Equal(t, want, buf2.String())
	}

	p, buf = printer(output.YAML)
	require.NoError(t, p.Document(output.List{Items: []output.Object{obj}}))
	require.Equal(t, `items:
- actual_size: 2
  etag: e1
  provider_ids:
  - p-1
  - p-2
  ready_count: 1
  shard: dev-1
  spec:
    drain_timeout: null
    group_id: db
    image: ""
    instance_type: ""
    labels: {}
    rollout: null
    size: 2
    subnet_pool: ""
    template: worker
    user_data: ""
    user_data_format: ""
    user_data_sha256: ""
    vars:
      a<b: x&y
      role: db
  static: false
  up_to_date_count: 0
  updated_at: "2026-05-01T11:59:00Z"
  user_data_sha256: ""
`, buf.String())
}

func TestLargeNumbersSurvive(t *testing.T) {
	obj, err := output.Proto(&nstancev1.GroupSpec{Size: 4294967295}, nil)
	require.NoError(t, err)
	p, buf := printer(output.JSON)
	require.NoError(t, p.Document(obj))
	require.Contains(t, buf.String(), `"size": 4294967295`)
}

func TestStream(t *testing.T) {
	obj := func(id string) output.Object { return map[string]any{"id": id} }
	p, buf := printer(output.Table)
	s := p.Stream([]string{"SHARD", "GROUP", "SIZE"})
	require.NoError(t, s.Write(
		output.Event{Type: output.Added, Row: []string{"dev-1", "db", "2"}, Object: obj("db")},
		output.Event{Type: output.Added, Row: []string{"dev-1", "web", "10"}, Object: obj("web")},
	))
	require.NoError(t, s.Write(output.Event{Type: output.Modified, Row: []string{"dev-1", "db", "3"}}))
	require.NoError(t, s.Write(output.Event{Type: output.Deleted, Row: []string{"dev-1", "a-long-group", "3"}}))
	require.Equal(t, ""+
		"EVENT     SHARD  GROUP  SIZE\n"+
		"ADDED     dev-1  db     2\n"+
		"ADDED     dev-1  web    10\n"+
		"MODIFIED  dev-1  db     3\n"+
		"DELETED   dev-1  a-long-group  3\n", buf.String())

	// An empty first batch still prints the header.
	p, buf = printer(output.Table)
	require.NoError(t, p.Stream([]string{"SHARD"}).Write())
	require.Equal(t, "EVENT     SHARD\n", buf.String())

	p, buf = printer(output.JSON)
	s = p.Stream(nil)
	require.NoError(t, s.Write(output.Event{Type: output.Added, Object: obj("db")}, output.Event{Type: output.Deleted, Object: obj("web")}))
	require.Equal(t, `{"type":"ADDED","object":{"id":"db"}}`+"\n"+`{"type":"DELETED","object":{"id":"web"}}`+"\n", buf.String())
	for _, line := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		require.True(t, json.Valid([]byte(line)))
	}

	p, buf = printer(output.YAML)
	require.NoError(t, p.Stream(nil).Write(output.Event{Type: output.Modified, Object: obj("db")}))
	require.Equal(t, "---\nobject:\n  id: db\ntype: MODIFIED\n", buf.String())
}

func TestAge(t *testing.T) {
	p, _ := printer(output.Table)
	for d, want := range map[time.Duration]string{
		-time.Second: "0s", 0: "0s", 45 * time.Second: "45s", 119 * time.Second: "119s", 3 * time.Minute: "3m",
		5 * time.Hour: "5h", 47 * time.Hour: "47h", 72 * time.Hour: "3d",
	} {
		require.Equal(t, want, p.Age(now.Add(-d)), d)
	}
	require.Equal(t, "-", p.Age(time.Time{}))
}
