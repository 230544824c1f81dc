package bootstrap_test

import "github.com/golang-jwt/jwt/v5"

func jwtSubject(sub string) jwt.RegisteredClaims { return jwt.RegisteredClaims{Subject: sub} }
