package agenttest

import "github.com/golang-jwt/jwt/v5"

func nonceSubject(id string) jwt.RegisteredClaims { return jwt.RegisteredClaims{Subject: id} }
