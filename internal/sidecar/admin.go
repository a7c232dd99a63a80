package sidecar

import (
	"errors"
	"fmt"

	"handoff.dev/handoff/internal/admin"
	"handoff.dev/handoff/internal/config"
	"handoff.dev/handoff/internal/telemetry"
)

// AdminToken reads the admin API's token, when one is configured. A token
// file others may read is a configuration the sidecar refuses, as is one
// that cannot be read.
func AdminToken(a config.Admin) ([]byte, error) {
	if a.Token != "" {
		return []byte(a.Token), nil
	}
	if a.TokenFile == "" {
		return nil, nil
	}
	tok, err := admin.ReadToken(a.TokenFile)
	if err != nil {
		return nil, configError(fmt.Errorf("admin.token_file: %w", err))
	}
	return tok, nil
}

// listenAdmin binds the admin API's listener, unless the API is off.
func (s *Sidecar) listenAdmin(token []byte, checks []telemetry.Check) error {
	if !s.cfg.Admin.Enabled() {
		s.log.Info("admin API off: admin.token_file is not set")
		return nil
	}
	srcs := make([]admin.Source, len(s.sources))
	for i, src := range s.sources {
		srcs[i] = src.status
		srcs[i].Backlog = func() (telemetry.Estimate, bool) { return s.sampler.Estimate(src.name) }
	}
	adm, err := admin.Listen(admin.Options{
		Listen:             s.cfg.Admin.Listen,
		Token:              token,
		AllowAnonymousRead: s.cfg.Admin.AllowAnonymousRead,
		TokenName:          s.cfg.Admin.TokenName,
		DeadLetters:        s.deadLetters,
		Started:            s.started,
		// The same reasons /readyz gives, the first of them.
		NotReady: func() error {
			for _, c := range checks {
				if err := c.Ready(); err != nil {
					return errors.New(c.Name + ": " + err.Error())
				}
			}
			return nil
		},
		Engine:   s.engine,
		Journal:  s.journal,
		Sources:  srcs,
		Activity: s.activity,
		Logger:   s.log,
	})
	if err != nil {
		return err
	}
	s.admin = adm
	s.log.Info("admin API listening", "addr", adm.Addr())
	return nil
}
