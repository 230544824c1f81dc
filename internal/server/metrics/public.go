package metrics

import (
	"slices"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// TenantLabels are the labels that name a tenant's resources: an anonymous
// scrape never sees them.
var TenantLabels = []string{"tenant", "group"}

// Public returns g as an anonymous scrape may see it: every series loses
// its tenant and group labels, and series left with the same labels are
// merged (counters and gauges summed, the *_oldest_age_seconds gauges by
// their maximum). Histograms and summaries have no tenant labels today; one
// that had them would be left out rather than exposed.
func Public(g prometheus.Gatherer) prometheus.Gatherer {
	return publicGatherer{g}
}

type publicGatherer struct{ g prometheus.Gatherer }

func tenantLabel(name string) bool { return slices.Contains(TenantLabels, name) }

// Gather implements prometheus.Gatherer.
func (p publicGatherer) Gather() ([]*dto.MetricFamily, error) {
	mfs, err := p.g.Gather()
	out := make([]*dto.MetricFamily, 0, len(mfs))
	for _, mf := range mfs {
		if !anyTenantLabel(mf) {
			out = append(out, mf)
			continue
		}
		if m := aggregate(mf); len(m.GetMetric()) > 0 {
			out = append(out, m)
		}
	}
	return out, err
}

func anyTenantLabel(mf *dto.MetricFamily) bool {
	for _, m := range mf.GetMetric() {
		for _, lp := range m.GetLabel() {
			if tenantLabel(lp.GetName()) {
				return true
			}
		}
	}
	return false
}

// aggregate drops the tenant labels of mf's series and merges the series
// that then share their labels, sorted by their labels.
func aggregate(mf *dto.MetricFamily) *dto.MetricFamily {
	useMax := strings.HasSuffix(mf.GetName(), "_oldest_age_seconds")
	out := &dto.MetricFamily{Name: mf.Name, Help: mf.Help, Type: mf.Type, Unit: mf.Unit}
	byKey := map[string]*dto.Metric{}
	var keys []string
	for _, m := range mf.GetMetric() {
		var kept []*dto.LabelPair
		var key strings.Builder
		for _, lp := range m.GetLabel() {
			if tenantLabel(lp.GetName()) {
				continue
			}
			kept = append(kept, lp)
			key.WriteString(lp.GetName() + "\x00" + lp.GetValue() + "\x00")
		}
		var v float64
		switch mf.GetType() {
		case dto.MetricType_COUNTER:
			v = m.GetCounter().GetValue()
		case dto.MetricType_GAUGE:
			v = m.GetGauge().GetValue()
		case dto.MetricType_UNTYPED:
			v = m.GetUntyped().GetValue()
		default:
			continue
		}
		acc, ok := byKey[key.String()]
		if !ok {
			acc = &dto.Metric{Label: kept}
			switch mf.GetType() {
			case dto.MetricType_COUNTER:
				acc.Counter = &dto.Counter{Value: new(float64)}
			case dto.MetricType_GAUGE:
				acc.Gauge = &dto.Gauge{Value: new(float64)}
			default:
				acc.Untyped = &dto.Untyped{Value: new(float64)}
			}
			byKey[key.String()] = acc
			keys = append(keys, key.String())
		}
		var p *float64
		switch {
		case acc.Counter != nil:
			p = acc.Counter.Value
		case acc.Gauge != nil:
			p = acc.Gauge.Value
		default:
			p = acc.Untyped.Value
		}
		if useMax {
			*p = max(*p, v)
		} else {
			*p += v
		}
	}
	slices.Sort(keys)
	for _, k := range keys {
		out.Metric = append(out.Metric, byKey[k])
	}
	return out
}
