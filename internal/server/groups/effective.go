package groups

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/nstance-dev/nstance/internal/config"
	"github.com/nstance-dev/nstance/internal/layout"
	"github.com/nstance-dev/nstance/internal/server/provider"
)

// FallbackDrainTimeout applies when neither the instance, its group nor
// shard.default_drain_timeout sets one.
const FallbackDrainTimeout = 5 * time.Minute

// MaxImageLen bounds a group's image.
const MaxImageLen = 256

// Overrides are per-instance settings given to CreateInstance.
type Overrides struct {
	Template     string
	InstanceType string
	SubnetPool   string
	Vars         map[string]string
	// DrainTimeout replaces the group's (nil: the group's; 0: no drain).
	DrainTimeout *time.Duration
	// Image replaces the group's image (the reserved arg provider.ArgImage).
	Image string
	// UserDataSHA256 and UserDataFormat name bootstrap data sent with the
	// request; they replace the group's.
	UserDataSHA256, UserDataFormat string
}

// Effective is the merged configuration an instance is created with.
type Effective struct {
	Template     string
	InstanceType string
	SubnetPool   string
	Vars         map[string]string
	Args         map[string]string
	// DrainTimeout is the drain timeout, defaults applied (the shard's
	// default_drain_timeout, else FallbackDrainTimeout); 0 means the
	// instance is deleted without a drain.
	DrainTimeout time.Duration
	// UserDataSHA256 names the tenant's bootstrap data ("": the template's
	// userdata); a change rotates a group's members.
	UserDataSHA256, UserDataFormat string
}

// Resolve merges, lowest precedence first: config defaults, the template, the
// group spec (nil for an instance outside a group) and the overrides.
// Strings take the last non-empty value; vars and args are merged key by key.
func Resolve(cfg *config.Config, spec *Spec, o Overrides) (Effective, error) {
	var e Effective
	tmplName := o.Template
	if tmplName == "" && spec != nil {
		tmplName = spec.Template
	}
	if tmplName == "" {
		return e, fmt.Errorf("template: required")
	}
	t, ok := cfg.Templates[tmplName]
	if !ok {
		return e, fmt.Errorf("template: unknown template %q", tmplName)
	}
	e.Template = tmplName
	e.Vars, e.Args = map[string]string{}, map[string]string{}
	maps.Copy(e.Vars, cfg.Defaults.Vars)
	maps.Copy(e.Args, cfg.Defaults.Args)
	maps.Copy(e.Vars, t.Vars)
	maps.Copy(e.Args, t.Args)
	e.InstanceType, e.SubnetPool = t.InstanceType, t.SubnetPool
	e.DrainTimeout = cfg.Shard.DefaultDrainTimeout.D()
	if e.DrainTimeout <= 0 {
		e.DrainTimeout = FallbackDrainTimeout
	}
	if spec != nil {
		pick(&e.InstanceType, spec.InstanceType)
		pick(&e.SubnetPool, spec.SubnetPool)
		maps.Copy(e.Vars, spec.Vars)
		if spec.DrainTimeout != nil {
			e.DrainTimeout = max(*spec.DrainTimeout, 0)
		}
		e.UserDataSHA256, e.UserDataFormat = spec.UserDataSHA256, spec.UserDataFormat
		if spec.Image != "" {
			e.Args[provider.ArgImage] = spec.Image
		}
	}
	if o.UserDataSHA256 != "" {
		e.UserDataSHA256, e.UserDataFormat = o.UserDataSHA256, o.UserDataFormat
	}
	if o.Image != "" {
		e.Args[provider.ArgImage] = o.Image
	}
	pick(&e.InstanceType, o.InstanceType)
	pick(&e.SubnetPool, o.SubnetPool)
	maps.Copy(e.Vars, o.Vars)
	if o.DrainTimeout != nil {
		e.DrainTimeout = max(*o.DrainTimeout, 0)
	}
	if e.SubnetPool != "" && !cfg.Shard.HasSubnetPool(e.SubnetPool) {
		return e, fmt.Errorf("subnet_pool: unknown subnet pool %q", e.SubnetPool)
	}
	return e, nil
}

// CheckImage refuses an image (GroupSpec.image, CreateInstanceRequest.image)
// longer than MaxImageLen or with spaces or control characters.
func CheckImage(image string) *FieldError {
	if len(image) > MaxImageLen || strings.IndexFunc(image, func(r rune) bool { return r <= ' ' || r >= 0x7f }) >= 0 {
		return &FieldError{Key: "image", Reason: fmt.Sprintf("want at most %d printable characters without spaces, got %q", MaxImageLen, image)}
	}
	return nil
}

func pick(dst *string, v string) {
	if v != "" {
		*dst = v
	}
}

// FieldError names one bad field of a group spec.
type FieldError = config.FieldError

// Validate checks a dynamic group spec of tenant against the running
// config. Keys are the GroupSpec field names. Vars that would put a
// control-plane URI or a server name into a template certificate are
// refused (key "vars").
func Validate(cfg *config.Config, tenant, id string, s Spec) []FieldError {
	var errs []FieldError
	add := func(k, f string, a ...any) { errs = append(errs, FieldError{Key: k, Reason: fmt.Sprintf(f, a...)}) }
	if id == "" {
		add("group_id", "required")
	} else if err := layout.ValidateID("group id", id); err != nil || len(id) > 50 {
		add("group_id", "want 1-50 characters [A-Za-z0-9._-] starting with a letter or digit, got %q", id)
	}
	if s.Template == "" {
		add("template", "required")
	} else if _, ok := cfg.Templates[s.Template]; !ok {
		add("template", "unknown template %q", s.Template)
	}
	if s.Size < 0 || s.Size > MaxSize {
		add("size", "must be between 0 and %d, got %d", MaxSize, s.Size)
	}
	if s.SubnetPool != "" && !cfg.Shard.HasSubnetPool(s.SubnetPool) {
		add("subnet_pool", "unknown subnet pool %q", s.SubnetPool)
	}
	if s.DrainTimeout != nil && *s.DrainTimeout < 0 {
		add("drain_timeout", "must not be negative")
	}
	if r := s.Rollout; r.MaxSurge != nil || r.MaxUnavailable != 0 {
		switch surge := r.Surge(1); {
		case surge < 0 || surge > MaxSize:
			add("rollout.max_surge", "must be between 0 and %d, got %d", MaxSize, surge)
		case r.MaxUnavailable < 0 || r.MaxUnavailable > MaxSize:
			add("rollout.max_unavailable", "must be between 0 and %d, got %d", MaxSize, r.MaxUnavailable)
		case r.MaxSurge != nil && surge == 0 && r.MaxUnavailable == 0:
			add("rollout", "max_surge and max_unavailable must not both be 0 (the rotation could never proceed)")
		}
	}
	if fe := CheckImage(s.Image); fe != nil {
		errs = append(errs, *fe)
	}
	for k := range s.Vars {
		if k == "" {
			add("vars", "empty variable name")
		}
	}
	errs = append(errs, CheckMaps(cfg, s.Vars, s.Labels)...)
	if len(errs) == 0 {
		if eff, err := Resolve(cfg, &s, Overrides{}); err == nil {
			errs = append(errs, CheckCertificateNames(cfg, tenant, id, eff)...)
			errs = append(errs, CheckTenantVars(cfg, tenant, id, eff, s.Vars)...)
		}
	}
	return errs
}

// CheckTenantVars refuses tenant vars that would set the subject or names
// of a certificate signed by an imported CA (a kubelet's identity) without
// the template listing them in its tenant_vars.
func CheckTenantVars(cfg *config.Config, tenant, group string, eff Effective, tenantVars map[string]string) []FieldError {
	t := cfg.Templates[eff.Template]
	trusted := map[string]string{}
	maps.Copy(trusted, cfg.Defaults.Vars)
	maps.Copy(trusted, t.Vars)
	data := config.EffectiveData(cfg.Shard.ID, tenant, group, eff.Template, eff.InstanceType, eff.Vars, eff.Args)
	var errs []FieldError
	for _, reason := range cfg.CheckTenantVars(eff.Template, trusted, tenantVars, data) {
		errs = append(errs, FieldError{Key: "vars", Reason: reason})
	}
	return errs
}

// CheckMaps refuses tenant vars and labels (of a group, or an on-demand
// instance's own merged with its group's) beyond shard.limits: more entries
// than max_vars and max_labels, or a key or value longer than
// max_var_key_bytes, max_var_value_bytes, max_label_key_bytes or
// max_label_value_bytes. Each reason names the key, its length, the limit
// and its value; at most a few offending keys per map are listed.
func CheckMaps(cfg *config.Config, vars, labels map[string]string) []FieldError {
	lim := cfg.Shard.Limits.WithDefaults()
	var errs []FieldError
	if len(vars) > lim.MaxVars {
		errs = append(errs, FieldError{Key: "vars", Reason: fmt.Sprintf("%d entries, more than shard.limits.max_vars (%d)", len(vars), lim.MaxVars)})
	}
	if len(labels) > lim.MaxLabels {
		errs = append(errs, FieldError{Key: "labels", Reason: fmt.Sprintf("%d entries, more than shard.limits.max_labels (%d)", len(labels), lim.MaxLabels)})
	}
	errs = append(errs, checkLengths("vars", "var", vars, lim.MaxVarKeyBytes, lim.MaxVarValueBytes)...)
	errs = append(errs, checkLengths("labels", "label", labels, lim.MaxLabelKeyBytes, lim.MaxLabelValueBytes)...)
	return errs
}

// maxLengthErrors is how many too-long entries of one map are named.
const maxLengthErrors = 5

// checkLengths refuses keys and values of m longer than maxKey and maxValue
// bytes (the limits shard.limits.max_{kind}_key_bytes and _value_bytes).
func checkLengths(field, kind string, m map[string]string, maxKey, maxValue int) []FieldError {
	var errs []FieldError
	more := 0
	for _, k := range slices.Sorted(maps.Keys(m)) {
		var reasons []string
		if len(k) > maxKey {
			reasons = append(reasons, fmt.Sprintf("%s name %.32q... of %d bytes, more than shard.limits.max_%s_key_bytes (%d)", kind, k, len(k), kind, maxKey))
		}
		if v := m[k]; len(v) > maxValue {
			reasons = append(reasons, fmt.Sprintf("%s %.64q: value of %d bytes, more than shard.limits.max_%s_value_bytes (%d)", kind, k, len(v), kind, maxValue))
		}
		for _, r := range reasons {
			if len(errs) == maxLengthErrors {
				more++
				continue
			}
			errs = append(errs, FieldError{Key: field, Reason: r})
		}
	}
	if more > 0 {
		errs = append(errs, FieldError{Key: field, Reason: fmt.Sprintf("%d more %ss too long", more, kind)})
	}
	return errs
}

// CheckCertificateNames renders the certificate names of the effective
// template of an instance (of group, or on demand when group is empty) and
// refuses those a workload certificate may not carry. The signer checks
// again at issue time, with the server's full list of names.
func CheckCertificateNames(cfg *config.Config, tenant, group string, eff Effective) []FieldError {
	data := config.EffectiveData(cfg.Shard.ID, tenant, group, eff.Template, eff.InstanceType, eff.Vars, eff.Args)
	var errs []FieldError
	for _, reason := range cfg.CheckTemplateCertificates(eff.Template, data, cfg.WorkloadPolicy()) {
		errs = append(errs, FieldError{Key: "vars", Reason: "with these vars, " + reason})
	}
	return errs
}
