package strategy

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/duration"

	"github.com/nstance-dev/nstance/internal/devk8s/object"
)

// Column is one Table column: its definition and how a cell is read.
type Column struct {
	Def  metav1.TableColumnDefinition
	Cell func(obj map[string]any) any
}

// Age is the Age cell: time since creation.
func Age(obj map[string]any) any {
	ts := object.NestedString(obj, "metadata", "creationTimestamp")
	t, err := time.Parse(time.RFC3339, ts)
	if err != nil {
		return "<unknown>"
	}
	return duration.HumanDuration(time.Since(t))
}

// NameColumn is the Name column every Table starts with.
func NameColumn() Column {
	return Column{Def: metav1.TableColumnDefinition{Name: "Name", Type: "string", Format: "name", Description: "Name must be unique within a namespace."},
		Cell: func(o map[string]any) any { return object.NestedString(o, "metadata", "name") }}
}

// AgeColumn is the Age column.
func AgeColumn() Column {
	return Column{Def: metav1.TableColumnDefinition{Name: "Age", Type: "string", Description: "CreationTimestamp is a timestamp representing the server time when this object was created."}, Cell: Age}
}

// DefaultColumns are Name and Age, the columns of kinds without their own.
func DefaultColumns() []Column { return []Column{NameColumn(), AgeColumn()} }

// withNameAge places extra columns between Name and Age.
func withNameAge(extra ...Column) []Column {
	return append(append([]Column{NameColumn()}, extra...), AgeColumn())
}

// pathCol reads a column from a path, <none> when absent.
func pathCol(name, typ string, priority int32, path ...string) Column {
	return Column{Def: metav1.TableColumnDefinition{Name: name, Type: typ, Priority: priority}, Cell: func(o map[string]any) any {
		v, ok := object.Nested(o, path...)
		if !ok {
			return "<none>"
		}
		return v
	}}
}

// Field is one field selector key and how its value is read.
type Field struct {
	Name  string
	Value func(obj map[string]any) string
}

// pathFields are fields read at their dotted path.
func pathFields(names ...string) []Field {
	out := make([]Field, len(names))
	for i, n := range names {
		out[i] = pathField(n)
	}
	return out
}

func pathField(name string) Field {
	path := strings.Split(name, ".")
	return Field{Name: name, Value: func(obj map[string]any) string {
		v, ok := object.Nested(obj, path...)
		if !ok {
			return ""
		}
		return fmt.Sprint(v)
	}}
}

// boolField is a boolean field, false when absent.
func boolField(name string) Field {
	path := strings.Split(name, ".")
	return Field{Name: name, Value: func(obj map[string]any) string {
		v, _ := object.Nested(obj, path...)
		b, _ := v.(bool)
		return strconv.FormatBool(b)
	}}
}
