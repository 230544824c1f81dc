package difftest

import (
	"fmt"

	"sigs.k8s.io/yaml"
)

// Test CRDs for schema semantics: sprockets (namespaced, status
// subresource, two versions served with the None strategy: v1 stored,
// v1beta1 with other defaults and one field v1 prunes) and gizmos
// (cluster-scoped, no status subresource, preserve-unknown-fields at the
// root).
const sprocketSchemaV1 = `
type: object
properties:
  spec:
    type: object
    required: [size]
    x-kubernetes-validations:
    - rule: "self.minReplicas <= self.maxReplicas"
      message: minReplicas must not exceed maxReplicas
    - rule: "!has(oldSelf.class) || (has(self.class) && self.class == oldSelf.class)"
      message: class is immutable once set
    properties:
      size: {type: integer, minimum: 1, maximum: 10}
      color: {type: string, enum: [red, green, blue], default: red}
      name: {type: string, pattern: '^[a-z]+$', maxLength: 8}
      class: {type: string}
      minReplicas: {type: integer, default: 1}
      maxReplicas: {type: integer, default: 3}
      ratio: {type: number, minimum: 0, exclusiveMaximum: true, maximum: 1}
      enabled: {type: boolean}
      note: {type: string, nullable: true}
      tags:
        type: array
        maxItems: 3
        items: {type: string, minLength: 1}
        x-kubernetes-list-type: set
      ports:
        type: array
        x-kubernetes-list-type: map
        x-kubernetes-list-map-keys: [name]
        items:
          type: object
          required: [name]
          properties:
            name: {type: string}
            port: {type: integer, default: 80, minimum: 1, maximum: 65535}
      labels:
        type: object
        maxProperties: 2
        additionalProperties: {type: string}
      settings:
        type: object
        default: {}
        properties:
          timeout: {type: integer, default: 30}
          mode: {type: string, default: auto}
      extra:
        type: object
        x-kubernetes-preserve-unknown-fields: true
      embedded:
        type: object
        x-kubernetes-embedded-resource: true
        x-kubernetes-preserve-unknown-fields: true
      immutableID:
        type: string
        x-kubernetes-validations:
        - rule: self == oldSelf
          message: immutableID is immutable
      counter:
        type: integer
        x-kubernetes-validations:
        - rule: self >= oldSelf
          message: counter must not decrease
      window:
        type: object
        properties:
          start: {type: integer}
          end: {type: integer}
        x-kubernetes-validations:
        - rule: self.start < self.end
          messageExpression: "self.start > self.end ? 'window is reversed' : 'window is empty'"
          fieldPath: .start
          reason: FieldValueForbidden
  status:
    type: object
    properties:
      phase: {type: string, enum: [Pending, Ready, Failed]}
      observed: {type: integer, minimum: 0}
      message: {type: string, maxLength: 10}
    x-kubernetes-validations:
    - rule: "!has(self.observed) || self.observed < 100"
      message: observed must stay below 100
`

const gizmoSchema = `
type: object
x-kubernetes-preserve-unknown-fields: true
properties:
  spec:
    type: object
    properties:
      size: {type: integer, minimum: 1}
      mode: {type: string, enum: [a, b], default: a}
      strict:
        type: object
        properties:
          x: {type: string}
  status:
    type: object
    properties:
      count: {type: integer, minimum: 0}
`

func schemaOf(src string) map[string]any {
	var out map[string]any
	if err := yaml.Unmarshal([]byte(src), &out); err != nil {
		panic(fmt.Sprintf("test schema: %v", err))
	}
	return out
}

// sprocketSchemaV1beta1 is v1's with another color default and a field
// (legacy) only v1beta1 knows.
func sprocketSchemaV1beta1() map[string]any {
	s := schemaOf(sprocketSchemaV1)
	spec := s["properties"].(map[string]any)["spec"].(map[string]any)
	props := spec["properties"].(map[string]any)
	props["color"].(map[string]any)["default"] = "green"
	props["legacy"] = map[string]any{"type": "string"}
	return s
}

func schemaCRDs() []map[string]any {
	version := func(name string, storage bool, schema map[string]any, status bool) map[string]any {
		v := map[string]any{"name": name, "served": true, "storage": storage, "schema": map[string]any{"openAPIV3Schema": schema}}
		if status {
			v["subresources"] = map[string]any{"status": map[string]any{}}
		}
		return v
	}
	crd := func(plural, kind, scope string, versions ...any) map[string]any {
		return map[string]any{
			"apiVersion": "apiextensions.k8s.io/v1",
			"kind":       "CustomResourceDefinition",
			"metadata":   map[string]any{"name": plural + "." + testGroup},
			"spec": map[string]any{
				"group":    testGroup,
				"names":    map[string]any{"plural": plural, "kind": kind, "listKind": kind + "List"},
				"scope":    scope,
				"versions": versions,
			},
		}
	}
	sprockets := crd("sprockets", "Sprocket", "Namespaced",
		version("v1", true, schemaOf(sprocketSchemaV1), true),
		version("v1beta1", false, sprocketSchemaV1beta1(), true))
	sprockets["spec"].(map[string]any)["names"].(map[string]any)["singular"] = "sprocket"
	gizmos := crd("gizmos", "Gizmo", "Cluster", version("v1", true, schemaOf(gizmoSchema), false))
	gizmos["spec"].(map[string]any)["names"].(map[string]any)["singular"] = "gizmo"
	return []map[string]any{sprockets, gizmos}
}
