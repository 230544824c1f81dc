package nstancev1_test

import (
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

const pkgName = "nstance.v1"

// missingFields lists the fields of m that are not populated, by full name.
// A oneof counts as populated when any one of its alternatives is set.
func missingFields(m protoreflect.Message) []string {
	var missing []string
	fields := m.Descriptor().Fields()
	for i := 0; i < fields.Len(); i++ {
		fd := fields.Get(i)
		if oo := fd.ContainingOneof(); oo != nil && !oo.IsSynthetic() {
			continue
		}
		if !m.Has(fd) {
			missing = append(missing, string(fd.FullName()))
		}
	}
	oneofs := m.Descriptor().Oneofs()
	for i := 0; i < oneofs.Len(); i++ {
		oo := oneofs.Get(i)
		if !oo.IsSynthetic() && m.WhichOneof(oo) == nil {
			missing = append(missing, string(oo.FullName()))
		}
	}
	return missing
}

// expectedPopulated is the number of fields Range visits on a fully populated
// message: every plain field plus one alternative per oneof.
func expectedPopulated(md protoreflect.MessageDescriptor) int {
	n := 0
	fields := md.Fields()
	for i := 0; i < fields.Len(); i++ {
		if oo := fields.Get(i).ContainingOneof(); oo == nil || oo.IsSynthetic() {
			n++
		}
	}
	oneofs := md.Oneofs()
	for i := 0; i < oneofs.Len(); i++ {
		if !oneofs.Get(i).IsSynthetic() {
			n++
		}
	}
	return n
}

func TestFixturesAreFullyPopulated(t *testing.T) {
	for _, f := range fixtures() {
		t.Run(f.name, func(t *testing.T) {
			m := f.msg.ProtoReflect()
			require.Empty(t, missingFields(m))
			set := 0
			m.Range(func(protoreflect.FieldDescriptor, protoreflect.Value) bool {
				set++
				return true
			})
			require.Equal(t, expectedPopulated(m.Descriptor()), set)
		})
	}
}

func TestMissingFieldsDetectsGaps(t *testing.T) {
	tests := []struct {
		name string
		msg  proto.Message
		want []string
	}{
		{
			name: "group spec without labels and drain timeout",
			msg:  &nstancev1.GroupSpec{GroupId: "web", Template: "t", Size: 1, InstanceType: "x", SubnetPool: "p", Vars: map[string]string{"a": "b"}},
			want: []string{"nstance.v1.GroupSpec.drain_timeout", "nstance.v1.GroupSpec.labels", "nstance.v1.GroupSpec.user_data",
				"nstance.v1.GroupSpec.user_data_format", "nstance.v1.GroupSpec.user_data_sha256", "nstance.v1.GroupSpec.rollout",
				"nstance.v1.GroupSpec.image"},
		},
		{
			name: "unset oneof",
			msg:  &nstancev1.GetInstanceStatusRequest{},
			want: []string{"nstance.v1.GetInstanceStatusRequest.lookup"},
		},
		{
			name: "zero enum counts as unset",
			msg:  &nstancev1.InstanceAddress{Address: "10.0.0.1"},
			want: []string{"nstance.v1.InstanceAddress.type"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.Equal(t, tt.want, missingFields(tt.msg.ProtoReflect()))
		})
	}
}

func TestBinaryRoundTrip(t *testing.T) {
	for _, f := range fixtures() {
		t.Run(f.name, func(t *testing.T) {
			b, err := proto.Marshal(f.msg)
			require.NoError(t, err)
			require.NotEmpty(t, b)

			got := f.msg.ProtoReflect().New().Interface()
			require.NoError(t, proto.Unmarshal(b, got))
			require.True(t, proto.Equal(f.msg, got), "want %v\ngot  %v", f.msg, got)
			require.Empty(t, got.ProtoReflect().GetUnknown())

			// Deterministic marshalling (maps sorted) must be stable across runs.
			d1, err := proto.MarshalOptions{Deterministic: true}.Marshal(f.msg)
			require.NoError(t, err)
			d2, err := proto.MarshalOptions{Deterministic: true}.Marshal(got)
			require.NoError(t, err)
			require.Equal(t, d1, d2)
		})
	}
}

func TestJSONRoundTrip(t *testing.T) {
	for _, f := range fixtures() {
		t.Run(f.name, func(t *testing.T) {
			b, err := protojson.Marshal(f.msg)
			require.NoError(t, err)

			got := f.msg.ProtoReflect().New().Interface()
			require.NoError(t, protojson.UnmarshalOptions{DiscardUnknown: false}.Unmarshal(b, got))
			require.True(t, proto.Equal(f.msg, got), "json %s", b)

			// Enums are written by name, so a JSON consumer can read them without the schema.
			f.msg.ProtoReflect().Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
				if fd.Kind() == protoreflect.EnumKind && !fd.IsList() {
					name := fd.Enum().Values().ByNumber(v.Enum()).Name()
					require.Contains(t, string(b), `"`+string(name)+`"`)
				}
				return true
			})
		})
	}
}

// packageMessages returns every message (including nested ones, excluding map
// entries) declared in the nstance.v1 package.
func packageMessages(t *testing.T) []protoreflect.MessageDescriptor {
	t.Helper()
	var out []protoreflect.MessageDescriptor
	var walk func(protoreflect.MessageDescriptors)
	walk = func(mds protoreflect.MessageDescriptors) {
		for i := 0; i < mds.Len(); i++ {
			md := mds.Get(i)
			if md.IsMapEntry() {
				continue
			}
			out = append(out, md)
			walk(md.Messages())
		}
	}
	protoregistry.GlobalFiles.RangeFilesByPackage(pkgName, func(fd protoreflect.FileDescriptor) bool {
		walk(fd.Messages())
		return true
	})
	require.NotEmpty(t, out)
	return out
}

// collectPopulated records, recursively, every nstance.v1 field that is set
// somewhere inside m.
func collectPopulated(m protoreflect.Message, seen map[string]bool) {
	if m.Descriptor().ParentFile().Package() != pkgName {
		return
	}
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		seen[string(fd.FullName())] = true
		switch {
		case fd.IsList() && fd.Kind() == protoreflect.MessageKind:
			for i := 0; i < v.List().Len(); i++ {
				collectPopulated(v.List().Get(i).Message(), seen)
			}
		case fd.IsMap() && fd.MapValue().Kind() == protoreflect.MessageKind:
			v.Map().Range(func(_ protoreflect.MapKey, mv protoreflect.Value) bool {
				collectPopulated(mv.Message(), seen)
				return true
			})
		case !fd.IsList() && !fd.IsMap() && fd.Kind() == protoreflect.MessageKind:
			collectPopulated(v.Message(), seen)
		}
		return true
	})
}

// TestFixturesCoverEveryField fails when a message or field is added to the
// protos without a fixture exercising it.
func TestFixturesCoverEveryField(t *testing.T) {
	seen := map[string]bool{}
	for _, f := range fixtures() {
		collectPopulated(f.msg.ProtoReflect(), seen)
	}
	var uncovered []string
	for _, md := range packageMessages(t) {
		fields := md.Fields()
		for i := 0; i < fields.Len(); i++ {
			if name := string(fields.Get(i).FullName()); !seen[name] {
				uncovered = append(uncovered, name)
			}
		}
	}
	sort.Strings(uncovered)
	require.Empty(t, uncovered, "fields never populated by any fixture")
}

func TestEnumZeroValueIsUnspecified(t *testing.T) {
	var enums []protoreflect.EnumDescriptor
	var walk func(protoreflect.MessageDescriptors)
	walk = func(mds protoreflect.MessageDescriptors) {
		for i := 0; i < mds.Len(); i++ {
			for j := 0; j < mds.Get(i).Enums().Len(); j++ {
				enums = append(enums, mds.Get(i).Enums().Get(j))
			}
			walk(mds.Get(i).Messages())
		}
	}
	protoregistry.GlobalFiles.RangeFilesByPackage(pkgName, func(fd protoreflect.FileDescriptor) bool {
		for i := 0; i < fd.Enums().Len(); i++ {
			enums = append(enums, fd.Enums().Get(i))
		}
		walk(fd.Messages())
		return true
	})
	// Guard against the walk silently finding nothing.
	require.GreaterOrEqual(t, len(enums), 13)

	for _, ed := range enums {
		t.Run(string(ed.FullName()), func(t *testing.T) {
			zero := ed.Values().ByNumber(0)
			require.NotNil(t, zero, "enum has no zero value")
			require.True(t, strings.HasSuffix(string(zero.Name()), "_UNSPECIFIED"), "zero value %s", zero.Name())
			require.Equal(t, 0, ed.Values().Get(0).Index())
			require.GreaterOrEqual(t, ed.Values().Len(), 2, "enum has no meaningful value")
		})
	}
}
