// A certified OpenID provider (the npm package oidc-provider) for the tests
// of signing in with a company's identity provider. It registers one client
// for the harness and a few people whose `groups` claim says what they may
// do; a person signs in with their name and any password.
//
// Environment:
//   OIDC_PORT                 the port to listen on (127.0.0.1)
//   OIDC_ISSUER               the issuer it names (default http://127.0.0.1:PORT)
//   OIDC_CLIENT_ID, OIDC_CLIENT_SECRET, OIDC_REDIRECT_URI   the harness's registration
//   OIDC_GROUPS_IN            "id_token" (default) or "userinfo": where `groups` goes
//   OIDC_TAMPER               "expired", "audience", "issuer" or "nonce": the
//                             token endpoint's ID token is signed again with the
//                             provider's own key after that claim is changed
//                             (an hour in the past, another client, another
//                             issuer, another sign-in's nonce)
//   OIDC_PUBLISH_OTHER_KEYS   "always": its key set names keys it does not sign
//                             with; "once": only its first answer does (a
//                             rotation the harness has not seen yet)
// It prints `listening <issuer>` once it answers.

import { generateKeyPair, exportJWK, importJWK, decodeJwt, SignJWT } from 'jose';
import Provider from 'oidc-provider';

const port = Number(process.env.OIDC_PORT);
const issuer = process.env.OIDC_ISSUER || `http://127.0.0.1:${port}`;

const people = {
  ada: { name: 'Ada Lovelace', email: 'ada@example.com', groups: ['support-leads'] },
  bea: { name: 'Bea Fox', email: 'bea@example.com', groups: ['billing-leads', 'support'] },
  vic: { name: 'Vic Moss', email: 'vic@example.com', groups: ['support'] },
  pat: { name: 'Pat Root', email: 'pat@example.com', groups: ['platform'] },
  mo: { name: 'Mo Stray', email: 'mo@example.com', groups: ['marketing'] },
};

async function signingKey(kid) {
  const { privateKey } = await generateKeyPair('RS256', { extractable: true });
  return { ...(await exportJWK(privateKey)), kid, use: 'sig', alg: 'RS256' };
}

const signing = await signingKey('signing-1');
const other = await signingKey('elsewhere-1');
const publicPart = ({ d, p, q, dp, dq, qi, ...rest }) => rest;

const groupsInUserinfo = process.env.OIDC_GROUPS_IN === 'userinfo';
const provider = new Provider(issuer, {
  clients: [
    {
      client_id: process.env.OIDC_CLIENT_ID,
      client_secret: process.env.OIDC_CLIENT_SECRET,
      redirect_uris: [process.env.OIDC_REDIRECT_URI],
      grant_types: ['authorization_code'],
      response_types: ['code'],
      token_endpoint_auth_method: 'client_secret_basic',
    },
  ],
  jwks: { keys: [signing] },
  pkce: { required: () => true },
  scopes: ['openid', 'email', 'profile', 'groups'],
  claims: {
    openid: ['sub'],
    email: ['email', 'email_verified'],
    profile: ['name', 'preferred_username'],
    groups: ['groups'],
  },
  // Claims asked for by scope go in the ID token too, unless the test
  // wants them from userinfo only (what conforming providers do).
  conformIdTokenClaims: groupsInUserinfo,
  features: { devInteractions: { enabled: true } },
  async findAccount(ctx, id) {
    const person = people[id];
    if (!person) return undefined;
    return {
      accountId: id,
      async claims() {
        return {
          sub: id,
          name: person.name,
          preferred_username: id,
          email: person.email,
          email_verified: true,
          groups: person.groups,
        };
      },
    };
  },
  // The harness is the company's own application: no consent screen.
  async loadExistingGrant(ctx) {
    const grant = new ctx.oidc.provider.Grant({
      accountId: ctx.oidc.session.accountId,
      clientId: ctx.oidc.client.clientId,
    });
    grant.addOIDCScope('openid email profile groups');
    grant.addOIDCClaims(['groups']);
    await grant.save();
    return grant;
  },
});

const tamperings = {
  expired: (claims) => ({ ...claims, iat: claims.iat - 7200, exp: claims.exp - 7200 }),
  audience: (claims) => ({ ...claims, aud: 'another-application' }),
  issuer: (claims) => ({ ...claims, iss: 'https://issuer.invalid' }),
  nonce: (claims) => ({ ...claims, nonce: 'a-nonce-of-another-sign-in' }),
};

async function tampered(idToken, change) {
  const key = await importJWK(signing, 'RS256');
  return new SignJWT(change(decodeJwt(idToken)))
    .setProtectedHeader({ alg: 'RS256', kid: signing.kid, typ: 'JWT' })
    .sign(key);
}

let keySetAnswers = 0;
provider.use(async (ctx, next) => {
  const change = tamperings[process.env.OIDC_TAMPER];
  if (ctx.path === '/token' && change) {
    await next();
    if (ctx.body && ctx.body.id_token) {
      ctx.body = { ...ctx.body, id_token: await tampered(ctx.body.id_token, change) };
    }
    return;
  }
  if (ctx.path === '/jwks') {
    keySetAnswers += 1;
    const mode = process.env.OIDC_PUBLISH_OTHER_KEYS;
    if (mode === 'always' || (mode === 'once' && keySetAnswers === 1)) {
      ctx.type = 'application/jwk-set+json';
      ctx.body = { keys: [publicPart(other)] };
      return;
    }
  }
  if (ctx.path === '/_test/key-set-answers') {
    ctx.body = { answers: keySetAnswers };
    return;
  }
  await next();
});

provider.listen(port, '127.0.0.1', () => {
  console.log(`listening ${issuer}`);
});
