// Package output renders nstance-admin results in the format chosen with
// -o/--output: an aligned table for people (the default), or one JSON or YAML
// document for programs. Proto messages are rendered with protojson (proto
// field names, every field present) and then re-encoded with sorted keys, so
// the machine formats are byte-stable. Watch commands stream events: table
// rows with an EVENT column, or one compact JSON line / one YAML document per
// event ({"type": "ADDED|MODIFIED|DELETED", "object": ...}).
package output
