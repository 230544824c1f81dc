package agentapi

import (
	"context"
	"errors"
	"fmt"

	"github.com/nstance-dev/nstance/internal/config"
)

// secretFile fills a file of kind secret from its source. Its mode is
// config.MaxSecretFileMode when none is set and never looser (the agent
// caps secrets the same way).
func (s *TemplateSource) secretFile(ctx context.Context, key string, f config.TemplateFile, fs *FileSpec) {
	if fs.Mode == 0 {
		fs.Mode = config.MaxSecretFileMode
	}
	fs.Mode &= config.MaxSecretFileMode
	if s.Secret == nil {
		fs.Err = fmt.Errorf("%s (%s): no secret store configured on this server", key, fs.Path)
		return
	}
	got, err := s.Secret(ctx, f)
	if err != nil {
		fs.Err = fmt.Errorf("%s (%s): %w", key, fs.Path, err)
		return
	}
	fs.Content = got.Content
	if got.Stale != nil {
		fs.Warn = fmt.Errorf("%s (%s): %w", key, fs.Path, got.Stale)
	}
}

// storageFile fills a file of kind storage from its object, rendered as a
// template over the instance's data only when the file says so.
func (s *TemplateSource) storageFile(ctx context.Context, key string, f config.TemplateFile, data TemplateData, fs *FileSpec) {
	if s.Storage == nil {
		fs.Err = fmt.Errorf("%s (%s): no object storage configured on this server", key, fs.Path)
		return
	}
	got, err := s.Storage(ctx, f.Object)
	if err != nil {
		fs.Err = fmt.Errorf("%s (%s): %w", key, fs.Path, err)
		return
	}
	if got.Stale != nil {
		fs.Warn = fmt.Errorf("%s (%s): %w", key, fs.Path, got.Stale)
	}
	if !f.Template {
		fs.Content = got.Content
		return
	}
	out, err := config.Render(key+".object", string(got.Content), data)
	if err != nil {
		fs.Err = fmt.Errorf("%s (%s): rendering object %q: %w", key, fs.Path, f.Object, err)
		return
	}
	fs.Content = []byte(out)
}

// reportFileProblems logs and tells Refusals about the files of an
// instance whose source failed or is stale, once each time the set of
// problems changes (reported is what was said last; the new value is
// returned). The other files are delivered regardless.
func (s *Server) reportFileProblems(ref Ref, problems []error, reported string) string {
	if len(problems) == 0 {
		if reported != "" {
			s.o.Log.Info("every file source of the instance is readable again", "instance", ref.InstanceID)
		}
		return ""
	}
	err := fmt.Errorf("instance %s: %w", ref.InstanceID, errors.Join(problems...))
	if msg := err.Error(); msg == reported {
		return reported
	}
	s.o.Log.Error(err, "files not delivered or stale", "instance", ref.InstanceID, "tenant", ref.Tenant, "files", len(problems))
	if s.o.Refusals != nil {
		s.o.Refusals.ReportInstanceError(ref.Tenant, ref.Group, ref.InstanceID, err)
	}
	return err.Error()
}
